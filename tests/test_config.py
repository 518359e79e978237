"""Configuration (docs/architecture.md, "Start-up and shutdown"): flag > env > default, and every bad
value stops the start before listening.

The refusals run the real `vllm-use serve` child; the exact bounds (n passes, n+1 fails) are checked
through `config.load`, the same function the CLI calls, so no server is needed for them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO
from tests.support.server import free_port, start_server
from vllm_use.config import Config, build_parser, load
from vllm_use.errors import ConfigError

TOKEN_16 = "abcdefghijklmnop"


def serve_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_USE_")}
    env.update(extra or {})
    return env


def run_serve(
    data_dir: Path, *flags: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A start that must fail: run it to completion and capture what it printed."""
    return subprocess.run(
        [sys.executable, "-m", "vllm_use", "serve", "--data-dir", str(data_dir), *flags],
        env=serve_env(env),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )


def port_is_listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def assert_refused_before_listening(
    data_dir: Path, port: int, option: str, *flags: str, env: dict[str, str] | None = None
) -> str:
    result = run_serve(data_dir, *flags, env=env)
    assert result.returncode == 2, result.stderr
    assert option in result.stderr, result.stderr
    assert "listening" not in result.stdout + result.stderr
    assert not port_is_listening(port)
    # Configuration is validated before anything touches the disk.
    assert not data_dir.exists()
    return result.stderr


def parse(*flags: str, environ: dict[str, str] | None = None) -> Config:
    return load(build_parser().parse_args(["serve", *flags]), environ=environ or {})


def refusal(*flags: str, environ: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse(*flags, environ=environ)
    return info.value


# --- refused starts ---------------------------------------------------------------------------

BAD_PORTS = [pytest.param("0", id="zero"), pytest.param("65536", id="65536"), pytest.param("abc", id="abc")]


@pytest.mark.parametrize("value", BAD_PORTS)
def test_bad_port_flag_fails_the_start_naming_port(tmp_path: Path, value: str) -> None:
    data_dir = tmp_path / "data"
    result = run_serve(data_dir, "--port", value)
    assert result.returncode == 2, result.stderr
    assert "--port" in result.stderr
    assert "listening" not in result.stdout + result.stderr
    assert not data_dir.exists()


BAD_VALUES = [
    pytest.param("--log-level", "loud", id="log-level-loud"),
    pytest.param("--upstream", "http://example.com:8000", id="upstream-not-loopback"),
    pytest.param("--upstream", "http://127.0.0.1:8000/v1", id="upstream-with-path"),
    pytest.param("--upstream", "http://user:pw@127.0.0.1:8000", id="upstream-with-credentials"),
    pytest.param("--model-aliases", "a=b,a=c", id="aliases-duplicate"),
    pytest.param("--model-aliases", "noequals", id="aliases-no-equals"),
    pytest.param("--max-parallel-downloads", "0", id="downloads-0"),
    pytest.param("--max-parallel-downloads", "65", id="downloads-65"),
    pytest.param("--max-audit-records", "-1", id="audit-negative"),
    pytest.param("--trusted-origins", "notanorigin", id="origins-not-an-origin"),
    pytest.param("--admin-token", "short", id="admin-token-short"),
    pytest.param("--loop", "trio", id="loop-unknown"),
]


@pytest.mark.parametrize(("flag", "value"), BAD_VALUES)
def test_bad_flag_value_fails_the_start_before_listening_naming_the_flag(
    tmp_path: Path, flag: str, value: str
) -> None:
    port = free_port()
    assert_refused_before_listening(tmp_path / "data", port, flag, "--port", str(port), f"{flag}={value}")


def test_bad_env_value_fails_the_start_naming_the_env_var(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    result = run_serve(data_dir, env={"VLLM_USE_PORT": "abc"})
    assert result.returncode == 2, result.stderr
    assert "VLLM_USE_PORT" in result.stderr
    assert "--port" not in result.stderr
    assert not data_dir.exists()


def test_bad_env_log_level_fails_naming_the_env_var(tmp_path: Path) -> None:
    port = free_port()
    stderr = assert_refused_before_listening(
        tmp_path / "data", port, "VLLM_USE_LOG_LEVEL", "--port", str(port), env={"VLLM_USE_LOG_LEVEL": "loud"}
    )
    assert "--log-level" not in stderr


def test_good_port_flag_wins_over_a_bad_env_port(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data", env={"VLLM_USE_PORT": "abc"})
    try:
        assert server.fetch("/healthz", token=None).json() == {"status": "ok"}
    finally:
        assert server.stop() == 0


REJECTED_TOKENS = [
    pytest.param("Sh0rt-Secret!", id="too-short"),
    pytest.param("Comma,Secret-0123456789abcdef", id="comma"),
    pytest.param("Space Secret-0123456789abcdef", id="space"),
    pytest.param("L0ng-Secret-" + "x" * 520, id="too-long"),
]


@pytest.mark.parametrize("token", REJECTED_TOKENS)
def test_rejected_admin_token_flag_is_never_echoed(tmp_path: Path, token: str) -> None:
    port = free_port()
    stderr = assert_refused_before_listening(
        tmp_path / "data", port, "--admin-token", "--port", str(port), "--admin-token", token
    )
    assert token not in stderr
    assert token[:8] not in stderr


@pytest.mark.parametrize("token", REJECTED_TOKENS)
def test_rejected_admin_token_env_is_never_echoed(tmp_path: Path, token: str) -> None:
    port = free_port()
    stderr = assert_refused_before_listening(
        tmp_path / "data",
        port,
        "VLLM_USE_ADMIN_TOKEN",
        "--port",
        str(port),
        env={"VLLM_USE_ADMIN_TOKEN": token},
    )
    assert token not in stderr
    assert token[:8] not in stderr


def test_rejected_upstream_api_key_is_never_echoed(tmp_path: Path) -> None:
    port = free_port()
    key = "Upstream Key-0123456789abcdef"
    stderr = assert_refused_before_listening(
        tmp_path / "data", port, "--upstream-api-key", "--port", str(port), "--upstream-api-key", key
    )
    assert key not in stderr
    assert key[:8] not in stderr


# --- precedence ---------------------------------------------------------------------------------


def test_flag_wins_over_env_and_env_over_default() -> None:
    assert parse().port == 8080
    assert parse(environ={"VLLM_USE_PORT": "9001"}).port == 9001
    assert parse("--port", "9002", environ={"VLLM_USE_PORT": "9001"}).port == 9002


def test_env_error_names_the_env_var_and_flag_error_names_the_flag() -> None:
    assert (
        refusal(environ={"VLLM_USE_MAX_PARALLEL_DOWNLOADS": "0"}).option == "VLLM_USE_MAX_PARALLEL_DOWNLOADS"
    )
    assert refusal("--max-parallel-downloads", "0").option == "--max-parallel-downloads"


def test_defaults_listen_on_loopback_8080_with_models_under_the_data_dir(tmp_path: Path) -> None:
    config = parse("--data-dir", str(tmp_path / "d"))
    assert (config.host, config.port) == ("127.0.0.1", 8080)
    assert config.models_dir == tmp_path / "d" / "models"
    assert config.upstream == "http://127.0.0.1:8000"
    assert config.max_audit_records == 10000
    assert config.max_parallel_downloads == 2
    assert config.admin_token is None


def test_upstream_defaults_to_the_runtime_port() -> None:
    assert parse("--runtime-port", "8123").upstream == "http://127.0.0.1:8123"


# --- bounds: n passes, n+1 fails ----------------------------------------------------------------

INTEGER_BOUNDS = [
    pytest.param("--port", "port", 1, 65535, id="port"),
    pytest.param("--runtime-port", "runtime_port", 1, 65535, id="runtime-port"),
    pytest.param("--max-parallel-downloads", "max_parallel_downloads", 1, 64, id="max-parallel-downloads"),
    pytest.param("--max-audit-records", "max_audit_records", 0, 10_000_000, id="max-audit-records"),
]


@pytest.mark.parametrize(("flag", "attr", "lo", "hi"), INTEGER_BOUNDS)
def test_integer_options_accept_their_bounds_and_refuse_one_past(
    flag: str, attr: str, lo: int, hi: int
) -> None:
    assert getattr(parse(flag, str(lo)), attr) == lo
    assert getattr(parse(flag, str(hi)), attr) == hi
    assert refusal(f"{flag}={lo - 1}").option == flag
    assert refusal(f"{flag}={hi + 1}").option == flag


def test_runtime_ports_take_a_range_of_at_most_1000_ports_from_1024() -> None:
    assert parse().runtime_ports == range(8100, 8200)
    assert parse("--runtime-ports", "1024-2023").runtime_ports == range(1024, 2024)  # 1000 ports
    assert parse("--runtime-ports", "65535-65535").runtime_ports == range(65535, 65536)
    for bad in ("1023-1100", "1024-2024", "9000-8999", "8100", "8100-", "8100-65536", "a-b", "8100 - 8200"):
        assert refusal(f"--runtime-ports={bad}").option == "--runtime-ports", bad


@pytest.mark.parametrize("value", ["1.5", "", " ", "0x10", "1e3", "+5", "٣"])
def test_non_integer_port_is_refused(value: str) -> None:
    assert refusal(f"--port={value}").option == "--port"


@pytest.mark.parametrize("flag", ["--admin-token", "--upstream-api-key"])
def test_credentials_accept_16_to_512_characters_and_refuse_one_past(flag: str) -> None:
    attr = flag[2:].replace("-", "_")
    assert getattr(parse(flag, "a" * 16), attr) == "a" * 16
    assert getattr(parse(flag, "a" * 512), attr) == "a" * 512
    assert refusal(flag, "a" * 15).option == flag
    assert refusal(flag, "a" * 513).option == flag


def test_credential_error_message_never_holds_the_value() -> None:
    secret = "Secret With Space-0123456789"
    err = refusal("--admin-token", secret)
    assert secret not in str(err)
    assert "Secret" not in str(err)


def test_config_repr_never_shows_credentials() -> None:
    config = parse("--admin-token", TOKEN_16 + "-admin", "--upstream-api-key", TOKEN_16 + "-upstream")
    assert TOKEN_16 not in repr(config)
    assert TOKEN_16 not in str(config)


@pytest.mark.parametrize("level", ["debug", "info", "warning", "error", "INFO"])
def test_every_documented_log_level_is_accepted(level: str) -> None:
    assert parse("--log-level", level).log_level == level.lower()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
        ("https://localhost:8443", "https://localhost:8443"),
        ("http://[::1]:8000", "http://[::1]:8000"),
        ("http://127.5.6.7:9000", "http://127.5.6.7:9000"),
    ],
)
def test_loopback_upstream_origins_are_accepted(value: str, expected: str) -> None:
    assert parse("--upstream", value).upstream == expected


@pytest.mark.parametrize(
    "value",
    [
        "http://example.com:8000",
        "http://10.0.0.1:8000",
        "http://127.0.0.1:8000/v1",
        "http://127.0.0.1:8000?x=1",
        "http://127.0.0.1:8000#frag",
        "http://user:pw@127.0.0.1:8000",
        "http://user@127.0.0.1:8000",
        "ftp://127.0.0.1:8000",
        "127.0.0.1:8000",
        "http://127.0.0.1:99999",
    ],
)
def test_non_origin_or_non_loopback_upstream_is_refused(value: str) -> None:
    assert refusal("--upstream", value).option == "--upstream"


def test_model_aliases_parse_into_pairs() -> None:
    config = parse("--model-aliases", "gpt-4o=Qwen/Qwen3-8B, small = org/tiny-model")
    assert config.model_aliases == {"gpt-4o": "Qwen/Qwen3-8B", "small": "org/tiny-model"}


@pytest.mark.parametrize("value", ["a=b,a=c", "noequals", "=b", "a=", "a=b,,c=d", "a b=c"])
def test_malformed_model_aliases_are_refused(value: str) -> None:
    assert refusal("--model-aliases", value).option == "--model-aliases"


def test_trusted_origins_are_accepted_and_normalised() -> None:
    config = parse("--trusted-origins", "https://Console.Example:8443, http://127.0.0.1:3000")
    assert config.trusted_origins == ("https://console.example:8443", "http://127.0.0.1:3000")


@pytest.mark.parametrize(
    "value", ["notanorigin", "https://example.com/path", "ftp://example.com", "https://"]
)
def test_malformed_trusted_origins_are_refused(value: str) -> None:
    assert refusal("--trusted-origins", value).option == "--trusted-origins"


@pytest.mark.parametrize("value", ["0.0.0.0", "::1", "localhost", "127.0.0.1"])  # noqa: S104
def test_host_accepts_addresses_and_names(value: str) -> None:
    assert parse("--host", value).host == value


@pytest.mark.parametrize("value", ["", "bad host", "-x", "a\nb"])
def test_malformed_host_is_refused(value: str) -> None:
    assert refusal(f"--host={value}").option == "--host"


# --- secrets from files, and what the operator is warned about ---------------------------------


def secret_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def test_admin_token_file_is_read_once_at_start_and_works(tmp_path: Path) -> None:
    token = "file-admin-token-0123456789"
    path = secret_file(tmp_path / "admin.secret", token)
    server = start_server(tmp_path / "data", "--admin-token-file", str(path), admin_token=None)
    try:
        server.admin_token = token
        assert server.fetch("/api/system").status_code == 200
        path.write_text("another-token-0123456789\n")  # read once: a later change is not picked up
        assert server.fetch("/api/system").status_code == 200
        assert token not in server.log()
        # The generated bootstrap token is not created when a token file is given.
        assert not (server.data_dir / "admin-token").exists()
    finally:
        server.stop()


def test_upstream_api_key_file_is_read_into_the_config() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        key = "upstream-from-file-0123456789"
        path = secret_file(Path(tmp) / "upstream.secret", key)
        assert parse("--upstream-api-key-file", str(path)).upstream_api_key == key
        env = {"VLLM_USE_UPSTREAM_API_KEY_FILE": str(path)}
        assert parse(environ=env).upstream_api_key == key


@pytest.mark.parametrize("option", ["admin_token", "upstream_api_key"])
def test_a_secret_file_looser_than_0600_is_tightened_before_it_is_read(tmp_path: Path, option: str) -> None:
    path = secret_file(tmp_path / "s", "a" * 20, mode=0o644)
    flag = "--" + option.replace("_", "-") + "-file"
    assert getattr(parse(flag, str(path)), option) == "a" * 20
    assert path.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("option", ["admin-token", "upstream-api-key"])
def test_bad_secret_files_are_refused_naming_the_option(tmp_path: Path, option: str) -> None:
    flag = f"--{option}-file"
    good = secret_file(tmp_path / "good", "a" * 20)
    link = tmp_path / "link"
    link.symlink_to(good)
    short = secret_file(tmp_path / "short", "a" * 15)
    spaced = secret_file(tmp_path / "spaced", "a" * 10 + " " + "a" * 10)
    for path in (link, short, spaced, tmp_path / "missing", tmp_path):
        assert refusal(flag, str(path)).option == flag
    # The value and its file are two ways to give one secret: both at once is an error.
    err = refusal(f"--{option}", "b" * 20, flag, str(good))
    assert err.option == flag
    assert "b" * 20 not in str(err)


def test_secret_file_content_is_never_echoed_in_a_refusal(tmp_path: Path) -> None:
    path = secret_file(tmp_path / "s", "Secret With Space-0123456789")
    err = refusal("--admin-token-file", str(path))
    assert "Secret" not in str(err)


def test_a_secret_given_as_a_flag_is_accepted_with_a_warning_naming_cmdline(tmp_path: Path) -> None:
    token = "flag-admin-token-0123456789"
    server = start_server(tmp_path / "data", "--admin-token", token, admin_token=None)
    try:
        server.admin_token = token
        assert server.fetch("/api/system").status_code == 200
        log = server.log()
        assert "--admin-token was given on the command line" in log and "/proc/<pid>/cmdline" in log
        assert token not in log
    finally:
        server.stop()


def test_secrets_from_the_environment_or_files_bring_no_warning(tmp_path: Path) -> None:
    from vllm_use.config import start_warnings

    path = secret_file(tmp_path / "s", "a" * 20)
    assert start_warnings(parse("--upstream-api-key-file", str(path))) == []
    assert start_warnings(parse(environ={"VLLM_USE_ADMIN_TOKEN": "a" * 20})) == []
    flagged = start_warnings(parse("--upstream-api-key", "a" * 20))
    assert len(flagged) == 1 and "--upstream-api-key-file" in flagged[0]
    assert "a" * 20 not in flagged[0]


@pytest.mark.parametrize(
    ("host", "warned"),
    [("127.0.0.1", False), ("localhost", False), ("::1", False), ("0.0.0.0", True), ("192.168.1.5", True)],  # noqa: S104 - parsed, never bound
)
def test_listening_beyond_loopback_warns_that_there_is_no_tls(host: str, warned: bool) -> None:
    from vllm_use.config import start_warnings

    warnings = start_warnings(parse("--host", host))
    assert any("without TLS" in w for w in warnings) is warned


@pytest.mark.parametrize("flag", ["--allow-remote-code", "--allow-any-model-path"])
def test_operator_switches_are_off_by_default_and_take_no_value(flag: str) -> None:
    attr = flag[2:].replace("-", "_")
    env = "VLLM_USE_" + attr.upper()
    assert getattr(parse(), attr) is False
    assert getattr(parse(flag), attr) is True
    assert getattr(parse(environ={env: "true"}), attr) is True
    assert getattr(parse(environ={env: "0"}), attr) is False
    assert refusal(environ={env: "maybe"}).option == env


@pytest.mark.parametrize("char", ["\x01", "\x1f", "\x7f", "\x80", "\x9f"])
def test_a_text_option_with_a_control_character_is_refused(tmp_path: Path, char: str) -> None:
    """C0, DEL and C1 alike (vllm_use/fields.py): a path that would print as something else."""
    data_dir = str(tmp_path / f"data{char}dir")
    assert refusal("--data-dir", data_dir).option == "--data-dir"
    assert parse("--data-dir", str(tmp_path / "data\xa0dir")).data_dir.name == "data\xa0dir"  # NBSP is text

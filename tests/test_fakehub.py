"""The fake hub is faithful enough for the real `hf download` (huggingface_hub 2.4), and what that CLI does.

Each test runs the real CLI from the project's venv against a `FakeHub`, with a scrubbed environment
(a private HOME and HF_HOME, and the fence's proxies: tests/conftest.py), so nothing reaches the
internet or the user's caches. The
tests double as the record of the CLI's behaviour that the product's download supervisor relies on:
where partial bytes live, how it retries, what it prints, and how it exits.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import FENCED_ENV
from tests.fakes.hub import FakeHub
from tests.support.server import eventually

HF = str(Path(sys.executable).with_name("hf"))
MiB = 1024 * 1024
CHUNK = 10 * MiB  # huggingface_hub's DOWNLOAD_CHUNK_SIZE: the unit in which bytes reach the disk
REPO = "org/tiny"


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with FakeHub() as h:
        yield h


# Anything not sent to HF_ENDPOINT goes to the fence's sentinel (and fails the test), never out.
PROXIES = {k: v for k, v in FENCED_ENV.items() if k.lower().endswith("_proxy")}


def hf_env(hub: FakeHub, tmp_path: Path, **extra: str) -> dict[str, str]:
    """A child environment built from scratch: no user token, no user caches, no way out."""
    env = {
        **PROXIES,
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path / "home"),
        "HF_HOME": str(tmp_path / "hfhome"),
        "HF_ENDPOINT": hub.url,
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",  # no PyPI version check, no "skill not installed" hint
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "NO_COLOR": "1",
    }
    env.update(extra)
    return env


def hf_args(repo: str, local_dir: Path, *more: str, revision: str = "main") -> list[str]:
    return [HF, "download", repo, "--revision", revision, "--local-dir", str(local_dir), *more]


def run_hf(
    hub: FakeHub, tmp_path: Path, repo: str, local_dir: Path, *more: str, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        hf_args(repo, local_dir, *more),
        env=hf_env(hub, tmp_path, **env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def incomplete_files(local_dir: Path) -> list[Path]:
    return sorted((local_dir / ".cache" / "huggingface" / "download").rglob("*.incomplete"))


def payload_files(local_dir: Path) -> dict[str, bytes]:
    """The downloaded files, without the `.cache/huggingface` bookkeeping."""
    return {
        p.relative_to(local_dir).as_posix(): p.read_bytes()
        for p in local_dir.rglob("*")
        if p.is_file() and ".cache" not in p.relative_to(local_dir).parts
    }


def paths_of(hub: FakeHub) -> list[tuple[str, str]]:
    return [(r.method, r.path.split("?")[0]) for r in hub.requests]


# --- the happy path -----------------------------------------------------------------------------------


def test_download_matches_hub_byte_for_byte(hub: FakeHub, tmp_path: Path) -> None:
    files = {
        "config.json": b'{"model_type": "llama"}\n',
        "README.md": b"# tiny\n",
        "sub/dir/notes.txt": b"nested regular file\n",
        "sub/dir/file.bin": os.urandom(4096),  # nested LFS file
        "model.safetensors": os.urandom(3 * MiB),  # LFS: served through the CDN redirect
        "tokenizer.json": os.urandom(3 * MiB),  # large but not LFS: served by /resolve itself
    }
    sha = hub.add_repo(REPO, files)
    out = tmp_path / "out"

    result = run_hf(hub, tmp_path, REPO, out)

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"✓ Downloaded\n  path: {out}\n"
    assert payload_files(out) == files
    assert incomplete_files(out) == []
    seen = set(paths_of(hub))
    assert ("GET", f"/api/models/{REPO}/revision/main") in seen
    assert ("GET", f"/api/models/{REPO}/tree/{sha}") in seen
    for path in files:
        assert ("HEAD", f"/{REPO}/resolve/{sha}/{path}") in seen
    assert ("GET", f"/{REPO}/resolve/{sha}/tokenizer.json") in seen
    assert ("GET", f"/_cdn/{REPO}/{sha}/model.safetensors") in seen
    assert ("GET", f"/{REPO}/resolve/{sha}/model.safetensors") not in seen


def test_format_json_and_quiet_print_only_the_target_path(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, {"config.json": b"{}"})
    out = tmp_path / "out"

    as_json = run_hf(hub, tmp_path, REPO, out, "--format", "json")
    quiet = run_hf(hub, tmp_path, REPO, out, "-q")

    assert as_json.returncode == 0 and json.loads(as_json.stdout) == {"path": str(out)}
    assert quiet.returncode == 0 and quiet.stdout == f"{out}\n"
    assert as_json.stderr == quiet.stderr == ""


def test_second_download_of_a_complete_dir_makes_one_api_call(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, {"config.json": b"{}", "model.safetensors": os.urandom(1000)})
    out = tmp_path / "out"
    assert run_hf(hub, tmp_path, REPO, out).returncode == 0
    first = len(hub.requests)

    again = run_hf(hub, tmp_path, REPO, out)

    assert again.returncode == 0
    assert paths_of(hub)[first:] == [
        ("GET", "/api/agent-harnesses"),
        ("GET", f"/api/models/{REPO}/revision/main"),
    ]


def test_state_stays_under_hf_home_and_local_dir(hub: FakeHub, tmp_path: Path) -> None:
    sha = hub.add_repo(REPO, {"config.json": b"{}"})
    out = tmp_path / "out"

    assert run_hf(hub, tmp_path, REPO, out).returncode == 0

    assert not (tmp_path / "home").exists()
    # Even with --local-dir, the branch -> commit ref is written into the HF_HOME cache.
    assert (tmp_path / "hfhome" / "hub" / "models--org--tiny" / "refs" / "main").read_text() == sha
    assert (out / ".cache" / "huggingface" / "trees" / f"{sha}.json").is_file()
    assert (out / ".cache" / "huggingface" / "download" / "config.json.metadata").is_file()


def test_tree_pagination_is_followed(hub: FakeHub, tmp_path: Path) -> None:
    files = {f"shard-{i}.txt": str(i).encode() for i in range(5)}
    sha = hub.add_repo(REPO, files)
    hub.tree_page_size = 2

    result = run_hf(hub, tmp_path, REPO, tmp_path / "out")

    assert result.returncode == 0, result.stderr
    assert payload_files(tmp_path / "out") == files
    assert paths_of(hub).count(("GET", f"/api/models/{REPO}/tree/{sha}")) == 3


# --- tokens -------------------------------------------------------------------------------------------


def test_hf_token_arrives_as_bearer_but_not_at_the_cdn(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, {"config.json": b"{}", "model.safetensors": os.urandom(1000)})
    hub.require_token(REPO, "hf_secret")

    result = run_hf(hub, tmp_path, REPO, tmp_path / "out", HF_TOKEN="hf_secret")

    assert result.returncode == 0, result.stderr
    assert set(hub.authorizations()) == {"Bearer hf_secret"}
    for r in hub.requests:
        hub_call = r.path.startswith(("/api/models/", f"/{REPO}/"))
        assert ("authorization" in r.headers) == hub_call, r


def test_missing_required_token_fails_as_not_found(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, {"config.json": b"{}"})
    hub.require_token(REPO, "hf_secret")

    result = run_hf(hub, tmp_path, REPO, tmp_path / "out")

    assert result.returncode == 1
    assert result.stderr.startswith(f"Error: Model '{REPO}' not found.\n")
    assert hub.authorizations() == []
    assert not (tmp_path / "out" / "config.json").exists()


def test_wrong_token_fails_with_invalid_credentials(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, {"config.json": b"{}"})
    hub.require_token(REPO, "hf_secret")

    result = run_hf(hub, tmp_path, REPO, tmp_path / "out", HF_TOKEN="hf_wrong")

    assert result.returncode == 1
    assert result.stderr.startswith("Error: Client error '401 Unauthorized'")
    assert "Invalid credentials in Authorization header" in result.stderr


def test_gated_repo_without_token_requires_approval(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, {"config.json": b"{}"})
    hub.require_token(REPO, "hf_secret", gated=True)

    result = run_hf(hub, tmp_path, REPO, tmp_path / "out")

    assert result.returncode == 1
    assert result.stderr.startswith(f"Error: Access denied. Model '{REPO}' requires approval.")


def test_token_file_is_sent_implicitly_unless_disabled(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, {"config.json": b"{}"})
    (tmp_path / "hfhome").mkdir()
    (tmp_path / "hfhome" / "token").write_text("hf_from_file")

    assert run_hf(hub, tmp_path, REPO, tmp_path / "a").returncode == 0
    implicit = set(hub.authorizations())
    # HF_HUB_DISABLE_IMPLICIT_TOKEN also drops HF_TOKEN: only --token would still be sent.
    assert (
        run_hf(
            hub, tmp_path, REPO, tmp_path / "b", HF_TOKEN="t", HF_HUB_DISABLE_IMPLICIT_TOKEN="1"
        ).returncode
        == 0
    )

    assert implicit == {"Bearer hf_from_file"}
    assert set(hub.authorizations()) == implicit


# --- not found ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("token", [None, "hf_any"])
def test_unknown_repo_exits_1_with_not_found(hub: FakeHub, tmp_path: Path, token: str | None) -> None:
    result = run_hf(hub, tmp_path, "org/nope", tmp_path / "out", **({"HF_TOKEN": token} if token else {}))

    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.startswith("Error: Model 'org/nope' not found.\n")


def test_missing_hides_an_added_repo(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, {"config.json": b"{}"})
    hub.missing(REPO)

    result = run_hf(hub, tmp_path, REPO, tmp_path / "out")

    assert result.returncode == 1 and f"Model '{REPO}' not found." in result.stderr


def test_unknown_revision_exits_1(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, {"config.json": b"{}"})

    result = subprocess.run(
        hf_args(REPO, tmp_path / "out", revision="v9"),
        env=hf_env(hub, tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 1
    assert result.stderr.startswith(f"Error: Revision not found in model '{REPO}'.")


# --- faults -------------------------------------------------------------------------------------------


def test_persistent_cut_fails_after_five_retries_and_leaves_no_file(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, {"config.json": b"{}", "model.safetensors": os.urandom(3 * MiB)})
    hub.fail_midway(REPO, "model.safetensors", after_bytes=MiB)
    out = tmp_path / "out"

    result = run_hf(hub, tmp_path, REPO, out)

    assert result.returncode == 1
    # Not one of the CLI's known errors: a raw traceback, ending with httpx2's message.
    assert result.stderr.rstrip().endswith(
        "httpx2.RemoteProtocolError: peer closed connection without sending complete message body "
        f"(received {MiB} bytes, expected {3 * MiB})"
    )
    assert result.stderr.count("Trying to resume download...") == 5
    gets = hub.gets(REPO, "model.safetensors")
    assert len(gets) == 6
    # Each retry starts over (bytes reach the disk in CHUNKs, so none did) and is cut again...
    assert [g.headers.get("range") for g in gets] == [None] * 6
    assert hub.bytes_served(REPO, "model.safetensors") == 6 * MiB
    # ...after the CLI's 1-s pause: the hub recorded each GET before sending it a byte, so the next
    # one can only come a pause after that.
    assert all(later.at - earlier.at > 1.0 for earlier, later in itertools.pairwise(gets))
    assert not (out / "model.safetensors").exists()
    assert incomplete_files(out) == []  # the process-unique temp file is deleted on failure
    assert (out / "config.json").read_bytes() == b"{}"  # other files still complete


def test_connection_reset_fails_without_retry(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, {"model.safetensors": os.urandom(3 * MiB)})
    hub.fail_midway(REPO, "model.safetensors", after_bytes=MiB, reset=True)

    result = run_hf(hub, tmp_path, REPO, tmp_path / "out")

    assert result.returncode == 1
    assert result.stderr.rstrip().endswith("httpx2.ReadError: [Errno 104] Connection reset by peer")
    assert len(hub.gets(REPO, "model.safetensors")) == 1


def test_one_cut_is_resumed_with_a_range_from_the_last_whole_chunk(hub: FakeHub, tmp_path: Path) -> None:
    data = os.urandom(12 * MiB)
    hub.add_repo(REPO, {"model.safetensors": data})
    hub.fail_midway(REPO, "model.safetensors", after_bytes=11 * MiB, times=1)

    result = run_hf(hub, tmp_path, REPO, tmp_path / "out")

    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == data
    ranges = [r.headers.get("range") for r in hub.gets(REPO, "model.safetensors")]
    # Bytes are handed over in 10 MiB chunks: the 1 MiB after the last whole chunk is fetched again.
    assert ranges == [None, f"bytes={CHUNK}-"]


def test_cut_in_a_small_file_is_retried_from_zero(hub: FakeHub, tmp_path: Path) -> None:
    data = os.urandom(3 * MiB)
    hub.add_repo(REPO, {"model.safetensors": data})
    hub.fail_midway(REPO, "model.safetensors", after_bytes=2 * MiB, times=1)

    result = run_hf(hub, tmp_path, REPO, tmp_path / "out")

    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == data
    assert [r.headers.get("range") for r in hub.gets(REPO, "model.safetensors")] == [None, None]


def test_partial_bytes_live_in_incomplete_file_and_lag_by_up_to_a_chunk(hub: FakeHub, tmp_path: Path) -> None:
    data = os.urandom(25 * MiB)
    hub.add_repo(REPO, {"config.json": b"{}", "sub/model.safetensors": data})
    hub.slow(REPO, "sub/model.safetensors", bytes_per_second=10 * MiB)
    out = tmp_path / "out"
    partial_dir = out / ".cache" / "huggingface" / "download" / "sub"  # mirrors the file's directory
    etag = hashlib.sha256(data).hexdigest()  # an LFS file's etag; a regular file's is its git blob id

    proc = subprocess.Popen(
        hf_args(REPO, out), env=hf_env(hub, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    samples: list[tuple[int, int]] = []  # (bytes the hub has sent, bytes in the .incomplete file)
    try:

        def lagging_partial_seen() -> bool:
            served = hub.bytes_served(REPO, "sub/model.safetensors")
            for p in incomplete_files(out):
                if f".{etag}." not in p.name:
                    continue  # config.json's own, short-lived temp file
                assert p.parent == partial_dir
                try:
                    samples.append((served, p.stat().st_size))
                except FileNotFoundError:
                    continue
            # 2 MiB past the first chunk on the wire, yet exactly one chunk on disk.
            return any(size == CHUNK and sent >= CHUNK + 2 * MiB for sent, size in samples)

        eventually(lagging_partial_seen, timeout=20, interval=0.02)
        assert not (out / "sub" / "model.safetensors").exists()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.communicate()

    assert all(size <= sent for sent, size in samples)
    assert (out / "sub" / "model.safetensors").read_bytes() == data
    assert incomplete_files(out) == []


def test_sigterm_leaves_an_orphan_incomplete_file(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, {"model.safetensors": os.urandom(25 * MiB)})
    hub.slow(REPO, "model.safetensors", bytes_per_second=10 * MiB)
    out = tmp_path / "out"

    proc = subprocess.Popen(
        hf_args(REPO, out), env=hf_env(hub, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        eventually(
            lambda: any(p.stat().st_size == CHUNK for p in incomplete_files(out)), timeout=20, interval=0.02
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == -signal.SIGTERM
    finally:
        proc.kill()
        proc.communicate()

    # Nobody deletes it and a later run never reuses it (its name carries a per-process uuid).
    assert [p.stat().st_size for p in incomplete_files(out)] == [CHUNK]
    assert not (out / "model.safetensors").exists()


def test_block_stalls_the_body_until_unblock(hub: FakeHub, tmp_path: Path) -> None:
    data = os.urandom(1000)
    hub.add_repo(REPO, {"model.safetensors": data})
    hub.block(REPO, "model.safetensors")
    out = tmp_path / "out"

    proc = subprocess.Popen(
        hf_args(REPO, out), env=hf_env(hub, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        eventually(lambda: hub.gets(REPO, "model.safetensors"), timeout=20)
        time.sleep(0.5)
        assert proc.poll() is None
        assert hub.bytes_served(REPO, "model.safetensors") == 0
        hub.unblock()
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()
        proc.communicate()
    assert (out / "model.safetensors").read_bytes() == data


def test_stall_times_out_per_download_timeout_then_fails(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, {"model.safetensors": os.urandom(1000)})
    hub.block(REPO, "model.safetensors")

    result = run_hf(hub, tmp_path, REPO, tmp_path / "out", HF_HUB_DOWNLOAD_TIMEOUT="1")

    assert result.returncode == 1
    assert result.stderr.rstrip().endswith("httpx2.ReadTimeout: timed out")
    gets = hub.gets(REPO, "model.safetensors")
    assert len(gets) == 6  # first try + 5 retries
    assert hub.bytes_served(REPO, "model.safetensors") == 0  # every try stalled from the first byte
    # A retry comes only once the try before it got its headers (the hub recorded it first) and
    # then read nothing for the whole 1-s timeout.
    assert all(later.at - earlier.at > 1.0 for earlier, later in itertools.pairwise(gets))


def test_stop_ends_open_connections_and_every_thread_serving_them(hub: FakeHub, tmp_path: Path) -> None:
    hub.add_repo(REPO, {"a.safetensors": os.urandom(4 * MiB), "b.safetensors": os.urandom(1000)})
    hub.slow(REPO, "a.safetensors", bytes_per_second=MiB)
    hub.block(REPO, "b.safetensors")
    out = tmp_path / "out"

    proc = subprocess.Popen(
        hf_args(REPO, out), env=hf_env(hub, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        eventually(lambda: hub.gets(REPO, "a.safetensors") and hub.gets(REPO, "b.safetensors"), timeout=20)
        # One body is sleeping between chunks and one is blocked: both waits watch the stop event,
        # so every thread is gone when stop() returns (the timeout is only its bound on the joins).
        assert hub.stop(timeout=10) == []
        assert proc.wait(timeout=30) == 1  # retries hit "connection refused", then it gives up
    finally:
        proc.kill()
        proc.communicate()
    assert incomplete_files(out) == []


# --- the fake's own HTTP surface ----------------------------------------------------------------------


def test_resolve_headers_ranges_and_errors(hub: FakeHub) -> None:
    sha = hub.add_repo(REPO, {"a.txt": b"0123456789", "w.safetensors": b"x" * 100})
    with httpx.Client(base_url=hub.url, trust_env=False) as client:
        head = client.head(f"/{REPO}/resolve/main/a.txt")
        part = client.get(f"/{REPO}/resolve/{sha}/a.txt", headers={"Range": "bytes=4-"})
        beyond = client.get(f"/{REPO}/resolve/{sha}/a.txt", headers={"Range": "bytes=10-"})
        lfs = client.head(f"/{REPO}/resolve/main/w.safetensors")
        entry = client.head(f"/{REPO}/resolve/main/nope.txt")
        anon = client.get("/api/models/org/nope/revision/main")
        authed = client.get("/api/models/org/nope/revision/main", headers={"Authorization": "Bearer x"})

    assert head.status_code == 200
    assert head.headers["X-Repo-Commit"] == sha
    assert head.headers["ETag"].strip('"') == "ad471007bd7f5983d273b9584e5629230150fd54"  # git hash-object
    assert head.headers["Content-Length"] == "10"
    assert (part.status_code, part.content, part.headers["Content-Range"]) == (206, b"456789", "bytes 4-9/10")
    assert beyond.status_code == 416
    assert lfs.status_code == 302
    assert lfs.headers["Location"].startswith(f"http://localhost:{hub.port}/_cdn/")
    assert lfs.headers["X-Linked-Size"] == "100"
    assert len(lfs.headers["X-Linked-Etag"].strip('"')) == 64
    assert (entry.status_code, entry.headers["X-Error-Code"]) == (404, "EntryNotFound")
    assert (anon.status_code, anon.headers["X-Error-Code"]) == (401, "RepoNotFound")
    assert (authed.status_code, authed.json()) == (404, {"error": "Repository not found"})


def test_requests_are_recorded_with_lowercase_headers(hub: FakeHub) -> None:
    with httpx.Client(base_url=hub.url, trust_env=False) as client:
        client.get("/api/whatever?x=1", headers={"Authorization": "Bearer abc", "X-Custom": "1"})

    [request] = hub.requests
    assert (request.method, request.path) == ("GET", "/api/whatever?x=1")
    assert request.headers["x-custom"] == "1"
    assert hub.authorizations() == ["Bearer abc"]

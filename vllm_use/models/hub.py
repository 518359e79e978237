"""Ask the Hugging Face Hub about a repository before anything is saved (docs/models-and-downloads.md,
"Add model").

`check(repository, revision, token)` runs in the executor (it makes blocking HTTP calls) and returns
nothing when the repository can be downloaded with that token, else raises one of our errors with a
message for the operator:

    the hub says                                   we raise                     loc
    repository not found (401/404 RepoNotFound)    NotFound "… was not found    source
                                                   on the hub (check the spelling…)"
    revision not found                             NotFound                     revision
    gated, and the token has no access             InvalidArguments             token
    the token itself is refused (401)              InvalidArguments             token
    disabled repository                            Conflict                     source
    unreachable, timeout, offline mode, 5xx        UpstreamUnavailable "… (nothing was added)"

A private repository looks exactly like a missing one to a client without a token (the hub answers
401 RepoNotFound for both), so the not-found message says a private one needs a token. A gated
repository's info is public (`gated: "auto"|"manual"`): access is then checked with the hub's
`auth-check` endpoint. `HF_ENDPOINT` is honoured, as for the `hf` CLI the download runs.
"""

from __future__ import annotations

import os

from vllm_use.errors import Conflict, InvalidArguments, NotFound, UpstreamUnavailable

DEFAULT_ENDPOINT = "https://huggingface.co"
HTTP_TIMEOUT_S = 15.0  # each call; abilities/models.py also bounds the whole check


def endpoint() -> str:
    """The hub the server (and `hf`) talks to: `HF_ENDPOINT`, else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def unreachable(why: str) -> UpstreamUnavailable:
    return UpstreamUnavailable(
        f"the Hugging Face Hub at {endpoint()} could not be asked about the repository ({why}); "
        "nothing was added. Check the network (or HF_ENDPOINT / HF_HUB_OFFLINE) and try again"
    )


def check(repository: str, revision: str, token: str | None) -> None:
    """Runs in the executor. Returns when `repository@revision` exists and `token` may download it."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        DisabledRepoError,
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    api = HfApi(endpoint=endpoint())
    auth: str | bool = token or False  # never a token saved on this machine: only the one given
    try:
        info = api.model_info(repository, revision=revision, timeout=HTTP_TIMEOUT_S, token=auth)
        if getattr(info, "gated", False):
            api.auth_check(repository, token=auth)
    except GatedRepoError:
        hint = (
            "this token's account has not been granted access; ask for it on the repository's page"
            if token
            else "give a Hugging Face token of an account that has been granted access"
        )
        raise InvalidArguments(
            f"{repository} is gated on the hub: {hint}",
            errors=[{"loc": ["token"], "msg": f"{repository} is gated: {hint}"}],
        ) from None
    except RevisionNotFoundError:
        msg = f"{repository} has no revision {revision!r} on the hub"
        raise NotFound(msg, errors=[{"loc": ["revision"], "msg": msg}]) from None
    except RepositoryNotFoundError as exc:
        if token and _status(exc) == 401:  # a token the hub does not accept at all
            raise refused_token(exc) from None
        msg = (
            f"{repository} was not found on the hub, or this token has no access to it (check the spelling)"
            if token
            else f"{repository} was not found on the hub (check the spelling; a private repository "
            "also needs a token with access)"
        )
        raise NotFound(msg, errors=[{"loc": ["source"], "msg": msg}]) from None
    except DisabledRepoError:
        msg = f"{repository} has been disabled on the hub"
        raise Conflict(msg, errors=[{"loc": ["source"], "msg": msg}]) from None
    except OfflineModeIsEnabled:
        raise unreachable("HF_HUB_OFFLINE is set") from None
    except HfHubHTTPError as exc:
        status = _status(exc)
        if status == 401 and token:
            raise refused_token(exc) from None
        raise unreachable(f"it answered {status}" if status else type(exc).__name__) from None
    except (OSError, TimeoutError) as exc:
        raise unreachable(type(exc).__name__) from None
    except Exception as exc:  # httpx's transport errors (connect, read timeout) and the like
        if type(exc).__module__.split(".")[0] in ("httpx", "httpcore", "httpx2", "requests", "urllib3"):
            raise unreachable(type(exc).__name__) from None
        raise


def refused_token(exc: Exception) -> InvalidArguments:
    msg = "the hub refused this token (invalid credentials); check it, or leave it empty for a public repository"
    return InvalidArguments(msg, errors=[{"loc": ["token"], "msg": msg}])


def _status(exc: Exception) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)

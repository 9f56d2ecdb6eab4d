"""JSON over HTTP to an inference server: retries when a request never reached the server
(and, when asked, on 429 and 5xx answers), and the errors the server engine raises.

A request that reached the server is never sent again while the server may still be
working on it: a read timeout raises :class:`ServerTimedOut` at once (sending the same
generation again would only queue a second copy behind the first)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any


class ServerUnreachable(ConnectionError):
    pass


class ServerTimedOut(TimeoutError):
    """The server took the request but did not answer in time; it was not sent again."""


class ServerRefused(RuntimeError):
    """The server answered with an HTTP error; the message carries its body."""

    def __init__(self, message: str, status: int, param: str | None) -> None:
        super().__init__(message)
        self.status, self.param = status, param


class StaleWeights(RuntimeError):
    """A response came from other weights than the ones requested."""


class MissingTokenIds(RuntimeError):
    """A response without the sampled token ids (training needs them exactly)."""


class WeightSyncError(RuntimeError):
    """The server did not load the new weights."""


def _request(url: str, data: bytes | None, api_key: str | None, timeout_s: float,
             retries: int, backoff_s: float, retry_http: bool, method: str) -> Any:
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    last: Exception | None = None
    for attempt in range(retries + 1):
        request = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                raw = resp.read().decode()
            try:
                return json.loads(raw)
            except json.JSONDecodeError:
                return raw
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")
            refused = ServerRefused(f"{url} answered {err.code}: {detail[:1000]}", err.code,
                                    _error_param(detail))
            if not retry_http or (err.code != 429 and err.code < 500):
                raise refused from err
            last = refused
        except urllib.error.URLError as err:  # the request never reached the server
            last = err
        except TimeoutError as err:  # sent, and the server may still be working on it
            raise ServerTimedOut(f"{url} did not answer within {timeout_s:g} s (not sent "
                                 "again: the server may still be working on it; give a "
                                 "longer timeout_s for a slow model)") from err
        except (ConnectionError, OSError) as err:  # it dropped the connection: not working
            last = err
        if attempt < retries:
            time.sleep(backoff_s * 2 ** attempt)
    if isinstance(last, ServerRefused):  # still failing: the server's own words
        raise ServerRefused(f"{last} (after {retries + 1} tries)", last.status, last.param)
    raise ServerUnreachable(f"cannot reach {url} after {retries + 1} tries: {last}")


def post_json(url: str, body: dict | None, api_key: str | None = None,
              timeout_s: float = 60.0, retries: int = 3, backoff_s: float = 0.5,
              retry_http: bool = True) -> Any:
    """POST ``body``; the decoded JSON answer (or text). Retries with exponential backoff
    on connection errors and, with ``retry_http``, on 429 and 5xx; any other HTTP error
    (every one without ``retry_http``) raises :class:`ServerRefused` with the server's
    body; :class:`ServerUnreachable` when the tries run out on connection errors."""
    data = json.dumps(body).encode() if body is not None else b""
    return _request(url, data, api_key, timeout_s, retries, backoff_s, retry_http, "POST")


def get_json(url: str, api_key: str | None = None, timeout_s: float = 60.0,
             retries: int = 3, backoff_s: float = 0.5) -> Any:
    return _request(url, None, api_key, timeout_s, retries, backoff_s, True, "GET")


def _error_param(detail: str) -> str | None:
    try:
        return json.loads(detail)["error"].get("param")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None

"""A small client for a zinfer router: ZeroMQ DEALER + MessagePack.

    pip install pyzmq msgpack

    from zinfer_client import Client

    with Client("tcp://127.0.0.1:5555") as client:
        print(client.models())                      # [{'name': 'smollm2-135m', 'workers': 1, ...}]
        done = client.generate("The capital of France is", max_tokens=8, temperature=0)
        print(done.text, done.finish_reason, done.usage)
        stream = client.stream(messages=[{"role": "user", "content": "Hi!"}])
        for chunk in stream:
            print(chunk.text, end="", flush=True)
        print(stream.result.usage)

Every call waits at most `timeout` seconds for each reply and raises
`ZinferTimeout` (a `ZinferError`) when none comes; errors the router or a
worker answer raise `ZinferError` with the protocol's `code`, `message` and
`retryable`. A request open when the connection to the router drops
(router restarted, network cut) raises `ZinferConnectionLost` (code
`unavailable`, retryable) at once: no reply for it can arrive any more.
The wire protocol is in docs/protocol.md. A `Client` owns one
socket: use it from one thread, one request at a time.

A router started with `--curve-key` speaks CURVE only: pass its public key
and your key pair (Z85 text, as `zinfer keys generate` writes them):

    server = load_public_key("keys/router.pub")
    public, secret = load_key_pair("keys/alice.key")
    Client(endpoint, curve_server_key=server, curve_public_key=public, curve_secret_key=secret)

A router that refuses the key closes the connection during the handshake;
the request then raises `ZinferRefused` (code `refused`, not retryable).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import msgpack
import zmq
import zmq.utils.monitor

__all__ = [
    "Client",
    "Chunk",
    "Completion",
    "Stream",
    "ZinferError",
    "ZinferTimeout",
    "load_key_pair",
    "load_public_key",
]

# Sampling and routing fields of a `generate` request (docs/protocol.md, section 3).
_GENERATE_FIELDS = frozenset(
    {
        "model",
        "namespace",
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "seed",
        "stop",
        "stop_token_ids",
        "ignore_eos",
        "priority",
        "deadline_ms",
    }
)


def _key_lines(path: str) -> list:
    with open(path, encoding="ascii") as f:
        return [line.strip() for line in f if line.strip() and not line.strip().startswith("#")]


def load_key_pair(path: str) -> tuple:
    """(public, secret) Z85 keys from a key pair file (`NAME.key`, with
    `public:` and `secret:` lines)."""
    fields = dict(line.split(":", 1) for line in _key_lines(path) if ":" in line)
    try:
        return fields["public"].strip(), fields["secret"].strip()
    except KeyError:
        raise ValueError(f"{path} is not a zinfer key pair file (needs public: and secret: lines)") from None


def load_public_key(path: str) -> str:
    """A Z85 public key from a `NAME.pub` file (or a key pair file's
    `public:` line)."""
    lines = _key_lines(path)
    for line in lines:
        if line.startswith("public:"):
            return line[len("public:"):].strip()
    if len(lines) != 1 or len(lines[0]) != 40:
        raise ValueError(f"{path} is not a zinfer public key file (one 40-character Z85 key)")
    return lines[0]


class ZinferError(Exception):
    """An `error` reply, or a failure to reach the router."""

    def __init__(self, code: str, message: str, retryable: bool = False):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retryable = retryable


class ZinferConnectionLost(ZinferError):
    """The connection to the router dropped while the request was open
    (router restarted, network cut): no reply for it can arrive any more.
    Retryable: send the request again."""

    def __init__(self, message: str):
        super().__init__("unavailable", message, retryable=True)


class ZinferRefused(ZinferError):
    """The router refused our CURVE key during the handshake (it is not on
    the router's client allow-list). Not retryable as is."""

    def __init__(self, message: str):
        super().__init__("refused", message, retryable=False)


class ZinferTimeout(ZinferError):
    """No reply arrived in time."""

    def __init__(self, message: str):
        super().__init__("timeout", message, retryable=True)


@dataclass
class Chunk:
    """New output of a streamed request."""

    index: int
    text: str
    tokens: list[int]


@dataclass
class Completion:
    """The `done` of a request: why it ended, usage and timings."""

    id: str
    finish_reason: str
    text: str
    usage: dict[str, int]
    timings: dict[str, float] = field(default_factory=dict)
    worker: str = ""


class Stream:
    """The chunks of a streamed request; `result` is its `Completion` once
    iteration ends. Leaving the loop early cancels the request."""

    def __init__(self, client: "Client", request_id: str):
        self._client = client
        self.id = request_id
        self.result: Optional[Completion] = None
        self._pieces: list[str] = []
        self._finished = False

    def __iter__(self) -> Iterator[Chunk]:
        try:
            while True:
                reply = self._client._recv_for(self.id)
                kind = reply.get("type")
                if kind == "chunk":
                    chunk = Chunk(reply["index"], reply.get("text", ""), list(reply.get("tokens", [])))
                    self._pieces.append(chunk.text)
                    yield chunk
                elif kind == "done":
                    self._finished = True
                    self.result = _completion(reply, "".join(self._pieces))
                    return
                else:
                    self._finished = True
                    raise _error(reply)
        finally:
            if not self._finished:
                self._finished = True
                self._client._send({"type": "cancel", "id": self.id})

    def text(self) -> str:
        """Consumes the rest of the stream and returns all of its text."""
        for _ in self:
            pass
        return "".join(self._pieces)


class Client:
    """A connection to a zinfer router's client socket."""

    def __init__(
        self,
        endpoint: str = "tcp://127.0.0.1:5555",
        timeout: float = 60.0,
        connect_timeout: float = 3.0,
        context: Optional[zmq.Context] = None,
        curve_server_key: Optional[str] = None,
        curve_public_key: Optional[str] = None,
        curve_secret_key: Optional[str] = None,
    ):
        """`timeout`: most seconds to wait for each reply. `connect_timeout`:
        most seconds for the router to answer the `ping` sent before the
        first request (no answer: no router listens at `endpoint`, or it
        refused our CURVE key). `curve_server_key` (the router's public
        key, Z85) turns CURVE on; `curve_public_key`/`curve_secret_key` are
        our key pair, on the router's client allow-list (left out: a
        throwaway pair, enough for a router without a client allow-list)."""
        self.endpoint = endpoint
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._socket = (context or zmq.Context.instance()).socket(zmq.DEALER)
        self._socket.setsockopt(zmq.LINGER, 0)
        if curve_server_key is not None:
            if curve_public_key is None or curve_secret_key is None:
                if curve_public_key is not None or curve_secret_key is not None:
                    raise ValueError("give both curve_public_key and curve_secret_key, or neither")
                curve_public_key, curve_secret_key = (k.decode() for k in zmq.curve_keypair())
            self._socket.curve_serverkey = curve_server_key.encode()
            self._socket.curve_publickey = curve_public_key.encode()
            self._socket.curve_secretkey = curve_secret_key.encode()
        elif curve_public_key is not None or curve_secret_key is not None:
            raise ValueError("curve_public_key/curve_secret_key need curve_server_key (the router's public key)")
        # A dropped connection loses every open request (a restarted router
        # knows none of them): watch for it rather than wait out timeouts.
        self._monitor = self._socket.get_monitor_socket(
            zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
        )
        self._drops = 0
        self._refused = False
        self._opened_at: dict[str, int] = {}
        self._socket.connect(endpoint)
        self._checked = False

    def close(self) -> None:
        self._socket.disable_monitor()
        self._monitor.close()
        self._socket.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def ping(self, timeout: Optional[float] = None) -> float:
        """Seconds the router took to answer a `ping`."""
        ping_id = uuid.uuid4().hex
        started = time.monotonic()
        self._send({"type": "ping", "id": ping_id})
        wait = self.connect_timeout if timeout is None else timeout
        try:
            self._recv_for(ping_id, wait)
        except ZinferTimeout:
            raise ZinferTimeout(
                f"no zinfer router answered at {self.endpoint} within {wait} s "
                "(is `zinfer router` or `zinfer serve` running there?)"
            ) from None
        self._checked = True
        return time.monotonic() - started

    def models(self) -> list[dict[str, Any]]:
        """The models workers serve: maps with `name`, `workers` and, when
        known, `context_length` and `vocab_size`."""
        self._check()
        models_id = uuid.uuid4().hex
        self._send({"type": "models", "id": models_id})
        reply = self._recv_for(models_id)
        if reply.get("type") != "models":
            raise _error(reply)
        return list(reply.get("models", []))

    def generate(
        self,
        prompt: Optional[str] = None,
        *,
        messages: Optional[list[dict[str, str]]] = None,
        tokens: Optional[list[int]] = None,
        **params: Any,
    ) -> Completion:
        """Generates and returns the whole answer (`stream: false`). Give one
        of `prompt` (raw text), `messages` (chat turns, rendered with the
        model's template) or `tokens`; `params` are the protocol's fields
        (`max_tokens`, `temperature`, `stop`, `model`, ...)."""
        request_id = self._start(prompt, messages, tokens, params, stream=False)
        reply = self._recv_for(request_id)
        if reply.get("type") != "done":
            raise _error(reply)
        return _completion(reply, reply.get("text", ""))

    def stream(
        self,
        prompt: Optional[str] = None,
        *,
        messages: Optional[list[dict[str, str]]] = None,
        tokens: Optional[list[int]] = None,
        **params: Any,
    ) -> Stream:
        """Like `generate`, but iterate the result for `Chunk`s as they come."""
        return Stream(self, self._start(prompt, messages, tokens, params, stream=True))

    def _start(self, prompt, messages, tokens, params, stream: bool) -> str:
        given = [name for name, v in (("prompt", prompt), ("messages", messages), ("tokens", tokens)) if v is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of prompt, messages or tokens (got {given or 'none'})")
        unknown = sorted(set(params) - _GENERATE_FIELDS)
        if unknown:
            raise TypeError(f"unknown generate fields {unknown}; known: {sorted(_GENERATE_FIELDS)}")
        self._check()
        request_id = uuid.uuid4().hex
        request: dict[str, Any] = {"type": "generate", "id": request_id, "stream": stream}
        request[given[0]] = {"prompt": prompt, "messages": messages, "tokens": tokens}[given[0]]
        request.update({k: v for k, v in params.items() if v is not None})
        self._send(request)
        return request_id

    def _check(self) -> None:
        if not self._checked:
            self.ping()

    def _send(self, message: dict[str, Any]) -> None:
        self._count_drops()
        if "id" in message and message.get("type") != "cancel":
            self._opened_at[message["id"]] = self._drops
        self._socket.send(msgpack.packb(message, use_bin_type=True))

    def _count_drops(self) -> None:
        while self._monitor.poll(0):
            event = zmq.utils.monitor.recv_monitor_message(self._monitor)
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._drops += 1
            elif event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self._refused = True

    def _recv_for(self, request_id: str, timeout: Optional[float] = None) -> dict[str, Any]:
        """The next reply about `request_id`; replies to other ids (left
        over from a cancelled stream) are skipped. An `error` without an id
        is the router refusing a frame it could not read: raised here."""
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self._monitor, zmq.POLLIN)
        while True:
            left = deadline - time.monotonic()
            ready = dict(poller.poll(int(left * 1000))) if left > 0 else {}
            if self._monitor in ready:
                self._count_drops()
            if self._drops > self._opened_at.get(request_id, self._drops):
                self._opened_at.pop(request_id, None)
                if self._refused:
                    raise ZinferRefused(
                        f"the router at {self.endpoint} refused our CURVE key: put our public key "
                        "on its --client-keys allow-list, or use a key that is on it"
                    )
                raise ZinferConnectionLost(
                    f"the connection to the router at {self.endpoint} dropped (router restarted or "
                    f"network cut) while request {request_id} was open; its output is lost: retry it"
                )
            if self._socket not in ready:
                if self._monitor in ready:
                    continue
                self._opened_at.pop(request_id, None)
                raise ZinferTimeout(f"no reply from {self.endpoint} within {wait} s for request {request_id}")
            reply = msgpack.unpackb(self._socket.recv(), raw=False)
            if not isinstance(reply, dict):
                raise ZinferError("bad_reply", f"expected a map, got {reply!r}")
            reply_id = reply.get("id")
            if reply_id == request_id:
                if reply.get("type") in ("done", "error", "pong", "models"):
                    self._opened_at.pop(request_id, None)
                return reply
            if reply_id is None and reply.get("type") == "error":
                raise _error(reply)


def _completion(reply: dict[str, Any], text: str) -> Completion:
    return Completion(
        id=reply["id"],
        finish_reason=reply["finish_reason"],
        text=text,
        usage=dict(reply.get("usage", {})),
        timings=dict(reply.get("timings", {})),
        worker=reply.get("worker", ""),
    )


def _error(reply: dict[str, Any]) -> ZinferError:
    if reply.get("type") == "error":
        return ZinferError(reply.get("code", "unknown"), reply.get("message", ""), bool(reply.get("retryable")))
    return ZinferError("bad_reply", f"unexpected reply {reply!r}")

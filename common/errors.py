"""The exception tree. Retry decisions key off these classes, never off message strings."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from common.models import Checkpoint


class EagleGenError(Exception):
    """Root of every error EagleGen raises on purpose."""


class ConfigError(EagleGenError):
    """The user's configuration or command line cannot work."""


class SourceError(EagleGenError):
    """A prompt source cannot be opened or read at all."""


class CollectorFenced(EagleGenError):
    """This collector no longer holds its run's lock: another one writes the run now."""


class RunMismatch(ConfigError):
    """A run already exists with other generation parameters."""


class RunRetired(ConfigError):
    """The run was retired: its ids are gone, so nothing can be added to it."""


class GenerationError(EagleGenError):
    """A model call failed; subclasses say whether trying again can help."""

    kind = "error"
    endpoint: str | None = None  # set by the client: where it failed
    tokens_streamed = 0  # set by the client: tokens received before it failed (wasted)
    # Set by the client when a turn broke mid-stream: what it had generated, to continue from.
    checkpoint: Checkpoint | None = None


class TransientError(GenerationError):
    """Worth retrying later: the server or network may recover."""


class ConnectError(TransientError):
    kind = "connect"


class TimeoutError_(TransientError):
    kind = "timeout"


class StallError(TransientError):
    kind = "stall"


class Disconnected(TransientError):
    kind = "disconnect"


class Unfinished(Disconnected):
    """The stream ended without a finish that means the model finished (``abort``, ``error``,
    an unknown reason, or none): a broken turn, continued from its checkpoint, never stored."""

    kind = "unfinished"


class RateLimited(TransientError):
    kind = "429"


class ServerError(TransientError):
    kind = "5xx"


class EmptyResponse(TransientError):
    kind = "empty"


class BadResponse(TransientError):
    """The endpoint answered something that is not an OpenAI response (a proxy page, say)."""

    kind = "bad_response"


class Unexpected(TransientError):
    """An exception outside this tree (a defect, or a library's surprise): retried like a
    transient one, so a sample it hits is failed past ``max_retries`` instead of run forever."""

    kind = "unexpected"


class NotContinued(BadResponse):
    """A continuation request was answered afresh (the server ignored the token-id prompt or
    ``continue_final_message``): the answer must not be joined to the saved partial."""

    kind = "not_continued"


class LeaseLost(TransientError):
    """Another worker took this sample over; stop spending GPU time on it."""

    kind = "lease_lost"


class WrongModel(LeaseLost):
    """This worker's model is not the one the capture run is pinned to: its message is dropped
    (not retried here, not a failure); the row stays pending for a worker with the run's model,
    the reconciler publishing it again."""

    kind = "wrong_model"


class HandedBack(GenerationError):
    """The worker is stopping: give the sample back to the queue, it did nothing wrong."""

    kind = "handed_back"


class PermanentError(GenerationError):
    """Retrying cannot help: the request itself is wrong (400, 401, 404, bad response)."""


class BadRequest(PermanentError):
    """The sample's own request is refused (its prompt over the context, a value the server
    refuses for it): it fails alone, and says nothing of the run's other samples."""

    kind = "400"


class EndpointRefused(PermanentError):
    """The endpoint refuses the run's requests whatever the sample (its route or the model
    missing, the key refused): the sample is tried on another endpoint before it fails."""


class AuthError(EndpointRefused):
    kind = "auth"


class NotFound(EndpointRefused):
    kind = "404"


class NoEndpoint(PermanentError):
    """Every endpoint is out of the run's rotation (each refused its requests): none is left to
    send the sample to."""

    kind = "no_endpoint"


class InvalidParams(PermanentError, ConfigError):
    """Generation parameters out of their allowed range (given, or stored with a run)."""

    kind = "bad_params"


class CircuitOpen(PermanentError):
    """The run's samples all failed the same permanent way: not attempted until retried."""

    kind = "circuit_open"


class NoTokenIds(EndpointRefused):
    """Token ids were required (EAGLEGEN_TOKEN_IDS=on) and the server does not give them."""

    kind = "no_token_ids"


class DiskFull(TransientError):
    """No room left for a hidden-state file (ENOSPC, quota): space may be freed."""

    kind = "disk_full"


class NonFinite(PermanentError):
    """A row's hidden states hold NaN or inf: never written, never silently skipped."""

    kind = "nonfinite"


class BadStates(PermanentError):
    """A row's hidden states fail a cheap check (a layer all zeros, tensors shorter than the
    row): the capture is broken, never written (``capture/checks.py``)."""

    kind = "bad_states"


class NotOurs(PermanentError):
    """A file at a capture file's path was not written by EagleGen: left as it is."""

    kind = "not_ours"


class CaptureMismatch(PermanentError):
    """A capture server's hidden states do not fit the run (other layers, dtype or width):
    the server was started for another layout or model."""

    kind = "capture_mismatch"


class BadRow(PermanentError):
    """The target's forward pass fails on this row alone (an id its embedding does not have,
    say): the same row fails the same way every time."""

    kind = "bad_row"


class DeviceLost(HandedBack):
    """The accelerator is unusable (a CUDA error poisons the process's context): the rows go
    back to the queue and the worker exits, for its supervisor to restart it."""

    kind = "device_lost"

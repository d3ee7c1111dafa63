"""How a refused control operation (configure, swap_quant, set_expert_mode) answers, in one table
for the three planes that take them: HTTP ``/control/*``, the merged port's binary ops and the
coordinator's bus. Each plane used to map the same exceptions itself, and they drifted (the
merged port alone called a non-sibling quant "incompatible").
"""

from __future__ import annotations

from dataclasses import dataclass

from hydrad.common.params import ParamError
from hydrad.common.registry import UnknownModel
from hydrad.engine.control import NoModel
from hydrad.engine.core import EngineBusy, SlotsBusy
from hydrad.wire import protocol as P


@dataclass(frozen=True)
class Refusal:
    http: int  # the HTTP status (the bus uses it too)
    status: P.Status  # the merged port's response code
    code: str  # the error code every plane reports
    message: str
    field: str | None = None  # the request field at fault, if one is
    retry: bool = False  # worth retrying as is, a moment later

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": "1"} if self.retry else {}


def refusal(exc: BaseException) -> Refusal | None:
    """The answer to ``exc`` if it is a refusal of the request; None for anything else (a bug: 500)."""
    if isinstance(exc, ParamError):
        status = P.Status.INCOMPATIBLE if exc.code == "not_sibling" else P.Status.BAD_REQUEST
        return Refusal(400, status, exc.code, str(exc), exc.fields[0] if exc.fields else None)
    if isinstance(exc, UnknownModel):
        return Refusal(404, P.Status.NOT_FOUND, "model_not_found", str(exc), "model")
    if isinstance(exc, SlotsBusy):
        return Refusal(409, P.Status.BUSY, "slots_busy", str(exc), retry=True)
    if isinstance(exc, EngineBusy):
        return Refusal(409, P.Status.CONFLICT, "busy", str(exc), retry=True)
    if isinstance(exc, NoModel):
        return Refusal(409, P.Status.CONFLICT, "no_model", str(exc))
    return None

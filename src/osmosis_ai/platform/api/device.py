"""Device-code login: ``POST /api/cli/device/authorize`` and ``POST /api/cli/device/token``.

The person approves the code on the web page ``/device`` (:mod:`osmosis_ai.platform.web`).
"""

from __future__ import annotations

from datetime import datetime
from urllib.parse import quote

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from osmosis_ai.platform.api.deps import Platform, PlatformDep
from osmosis_ai.platform.api.limits import RateLimiter
from osmosis_ai.platform.api.wire import UserOut, WireModel
from osmosis_ai.platform.services import device

router = APIRouter(prefix="/api/cli/device", tags=["auth"])

# Starting a login needs no token, so each address may start only a few a minute.
AUTHORIZE_LIMIT = 10
AUTHORIZE_WINDOW_S = 60.0


def authorize_limiter(platform: Platform) -> RateLimiter:
    """The per-address limit of ``/authorize`` (one per app)."""
    limiter = platform.extras.get("device_authorize_limiter")
    if not isinstance(limiter, RateLimiter):
        limiter = RateLimiter(AUTHORIZE_LIMIT, AUTHORIZE_WINDOW_S)
        platform.extras["device_authorize_limiter"] = limiter
    return limiter


class AuthorizeIn(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    device_name: str = Field(default="", alias="deviceName", max_length=200)


class AuthorizeOut(WireModel):
    device_code: str
    user_code: str
    verification_uri: str
    verification_uri_complete: str
    expires_in: int
    interval: int


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    device_code: str = Field(min_length=1, max_length=200)


class TokenOut(WireModel):
    token: str
    token_id: str
    user: UserOut
    expires_at: datetime


@router.post("/authorize")
def authorize(body: AuthorizeIn, request: Request, platform: PlatformDep) -> AuthorizeOut:
    address = request.client.host if request.client is not None else "an unknown address"
    authorize_limiter(platform).check(address, "device logins")
    with platform.transaction() as session:
        started = device.start(session, device_name=body.device_name, now=platform.now())
    page = f"{platform.settings.public_url}/device"
    return AuthorizeOut(
        device_code=started.device_code,
        user_code=started.user_code,
        verification_uri=page,
        verification_uri_complete=f"{page}?user_code={quote(started.user_code)}",
        expires_in=started.expires_in,
        interval=started.interval,
    )


@router.post("/token")
def token(body: TokenIn, platform: PlatformDep) -> TokenOut:
    with platform.transaction() as session:
        outcome = device.poll(
            session,
            body.device_code,
            platform_url=platform.settings.public_url,
            now=platform.now(),
        )
    if isinstance(outcome, device.DeviceFlowError):
        raise outcome
    issued, user = outcome
    return TokenOut(
        token=issued.raw,
        token_id=issued.id,
        user=UserOut(id=user.id, email=user.email, name=user.name),
        expires_at=issued.expires_at,
    )

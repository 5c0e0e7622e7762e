"""The processor's security state: the policy in force, the banned list, and the limits on
failed authentications and flapping clients. Pure: time is passed in, and bans that must be
stored are handed to a callback the node sets (`on_ban`)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from mop.log_limit import LimitedLog
from mop.security.abuse import Ban, BanList, FailureLimiter, FlappingDetector
from mop.security.authorization import Authorizer, ClientPermissions
from mop.security.identity import (
    AuthenticationError,
    AuthFailure,
    Credentials,
    Principal,
)
from mop.security.policy import SecurityPolicy, open_policy
from mop.settings import AuthSettings

log = logging.getLogger("mop.security")
_banned_refusals = LimitedLog(log)


class Gatekeeper:
    """Admits clients (`admit`) and answers what they may do (`permissions`).

    The policy can be replaced at any time (`replace`, on reload); clients admitted before
    keep their principal, and their remembered ACL answers are forgotten.
    """

    def __init__(
        self,
        policy: SecurityPolicy | None = None,
        settings: AuthSettings | None = None,
        *,
        bans: BanList | None = None,
    ) -> None:
        settings = settings or AuthSettings()
        self.leeway = settings.jwt.leeway
        self.policy = policy or open_policy()
        self.authorizer: Authorizer = self.policy.authorizer
        # Bumped with every new policy: clients forget what the old one allowed them.
        self.generation = 0
        self.bans = bans or BanList()
        self.failures = FailureLimiter(
            settings.max_failures, settings.failure_window, settings.failure_ban
        )
        flapping = settings.flapping
        self.flapping = (
            FlappingDetector(flapping.max_count, flapping.window, flapping.ban_time)
            if flapping.enabled
            else None
        )
        # Called with each ban this node decides (flapping) so that it is stored for all.
        self.on_ban: Callable[[Ban], None] = self.bans.put
        self.refused = 0
        # Told whenever a ban comes into force, so that adapters close the clients it covers.
        self._ban_listeners: list[Callable[[], None]] = []

    def share_bans(self, bans: BanList, store: Callable[[Ban], None]) -> None:
        """Follow the deployment's banned list (`BanStore.bans`) and hand the bans this node
        decides to `store`, which keeps them for every node."""
        self.bans = bans

        def decided(ban: Ban) -> None:
            bans.put(ban)  # in force here at once, before it is stored
            store(ban)

        self.on_ban = decided

    def on_bans_added(self, listener: Callable[[], None]) -> None:
        """Call `listener` whenever a ban may have come into force (`bans_added`)."""
        self._ban_listeners.append(listener)

    def bans_added(self) -> None:
        """A ban came into force (from `mop ban`, or another node): the listeners look for
        connected clients it covers."""
        for listener in self._ban_listeners:
            try:
                listener()
            except Exception:
                log.exception("closing the clients of a new ban failed")

    def ban_of(
        self, *, client_id: str, usernames: tuple[str | None, ...], address: str, now: float
    ) -> Ban | None:
        """The ban in force that covers a connected client, if any."""
        for username in usernames:
            ban = self.bans.match(client_id=client_id, username=username, address=address, now=now)
            if ban is not None:
                return ban
        return None

    def replace(self, policy: SecurityPolicy) -> None:
        self.policy = policy
        self.authorizer = policy.authorizer
        self.generation += 1

    def admit(self, credentials: Credentials, now: float) -> Principal:
        """The principal of a connecting client, or AuthenticationError (logged here)."""
        try:
            return self._admit(credentials, now)
        except AuthenticationError as exc:
            self.refused += 1
            line = (
                "refused client %r (user %r, address %s): %s",
                credentials.client_id[:200],
                (credentials.username or "")[:200] or None,
                credentials.address,
                exc.why,
            )
            if exc.failure is AuthFailure.BANNED:
                # Banned clients and blocked addresses retry in loops: a line per interval.
                _banned_refusals.warning("banned", *line)
            else:
                log.warning(*line)
            raise

    def _admit(self, credentials: Credentials, now: float) -> Principal:
        address = credentials.address
        if self.failures.blocked(address, now):
            raise AuthenticationError(
                AuthFailure.BANNED, "too many failed authentications from this address"
            )
        ban = self.bans.match(
            client_id=credentials.client_id,
            username=credentials.username,
            address=address,
            now=now,
        )
        if ban is not None:
            raise AuthenticationError(AuthFailure.BANNED, f"banned {ban.kind} ({ban.reason})")
        try:
            principal = self.policy.authenticator.authenticate(credentials, now)
        except AuthenticationError as exc:
            if exc.failure is not AuthFailure.NOT_AUTHORIZED and self.failures.failed(address, now):
                log.warning("address %s refused for a while: too many failed logins", address)
            raise
        # Failures are not forgotten on a success: an attacker's own good login between
        # guesses must not reset the count (they age out of the window instead).
        if principal.name is not None and principal.name != credentials.username:
            # A user the credentials prove (token subject, certificate) may itself be banned.
            ban = self.bans.match(client_id="", username=principal.name, address="", now=now)
            if ban is not None:
                raise AuthenticationError(AuthFailure.BANNED, f"banned user ({ban.reason})")
        if self.flapping is not None and credentials.client_id:
            ban = self.flapping.connected(credentials.client_id, now)
            if ban is not None:
                self.on_ban(ban)
                raise AuthenticationError(AuthFailure.BANNED, "client id connects too often")
        return principal

    def permissions(self, principal: Principal, client_id: str, address: str) -> ClientPermissions:
        return ClientPermissions(self, principal, client_id, address)

    def still_valid(self, principal: Principal, now: float) -> bool:
        """Whether a connected client's credential still holds (a token's expiry, with the
        clock difference the tokens are allowed)."""
        return principal.expires_at is None or principal.expires_at + self.leeway > now

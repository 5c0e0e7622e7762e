"""Roles: a duty that one node of the deployment performs at a time. A node enters with
`hold_role(name)`, learns of a gain or loss from `changed()`, and sees it in `held`. A merged
node is the whole deployment and holds every role; proxies get a role one at a time, and a
released role passes to a proxy that waits for it."""

from __future__ import annotations

import pytest
import trio

from mop.processor.backend import Backend, Role
from tests.conformance.harness import DEADLINE, QUIET, Deployment, Names

ONE_AT_A_TIME = "a merged node is the whole deployment: it holds every role itself"


async def gained(role: Role) -> None:
    with trio.fail_after(DEADLINE):
        assert await role.changed() is True
    assert role.held


async def test_a_lone_node_gets_the_role(backend: Backend, names: Names) -> None:
    role = await backend.hold_role(names.sub("role"))
    assert role.name == names.sub("role")
    await gained(role)
    await role.release()
    assert not role.held
    with trio.fail_after(DEADLINE):
        assert await role.changed() is False


async def test_changed_reports_nothing_while_nothing_changes(
    backend: Backend, names: Names
) -> None:
    role = await backend.hold_role(names.sub("role"))
    await gained(role)
    with trio.move_on_after(QUIET) as quiet:
        await role.changed()
    assert quiet.cancelled_caught, "a change was reported while the role stayed held"
    await role.release()


@pytest.mark.backends("local", reason="a merged node's role is permanent; a proxy's is not")
async def test_a_merged_node_holds_its_roles_from_the_start_for_good(
    backend: Backend, names: Names
) -> None:
    one = await backend.hold_role(names.sub("role"))
    two = await backend.hold_role(names.sub("role"))
    assert one.held and two.held and one.permanent
    await one.release()
    assert two.held


@pytest.mark.backends("cluster", reason=ONE_AT_A_TIME)
async def test_one_proxy_holds_a_role_and_a_released_role_passes_on(
    backend: Backend, peer: Backend, names: Names
) -> None:
    name = names.sub("role")
    roles = [await backend.hold_role(name), await peer.hold_role(name)]
    assert not any(role.permanent for role in roles)
    winners: list[Role] = []
    gains = [trio.Event(), trio.Event()]

    async def watch(role: Role) -> None:
        if await role.changed():
            winners.append(role)
            gains[len(winners) - 1].set()

    async with trio.open_nursery() as nursery:
        for role in roles:
            nursery.start_soon(watch, role)
        with trio.fail_after(DEADLINE):
            await gains[0].wait()
        await trio.sleep(QUIET)
        assert len(winners) == 1, "both proxies hold the role"
        [holder] = winners
        [waiter] = [role for role in roles if role is not holder]
        assert holder.held and not waiter.held
        await holder.release()
        with trio.fail_after(DEADLINE):
            await gains[1].wait()
        assert winners[1] is waiter and waiter.held
        await waiter.release()


@pytest.mark.backends("cluster", reason=ONE_AT_A_TIME)
async def test_roles_are_independent(backend: Backend, peer: Backend, names: Names) -> None:
    one = await backend.hold_role(names.sub("one"))
    await gained(one)
    two = await peer.hold_role(names.sub("two"))
    await gained(two)
    await one.release()
    await two.release()


@pytest.mark.backends("cluster", reason=ONE_AT_A_TIME)
async def test_a_proxy_that_stops_hands_the_role_on(
    deployment: Deployment, backend: Backend, names: Names
) -> None:
    name = names.sub("role")
    async with deployment.open_backend() as leaving:
        holder = await leaving.hold_role(name)
        await gained(holder)
        waiter = await backend.hold_role(name)
        with trio.move_on_after(QUIET):
            await waiter.changed()
        assert not waiter.held
    # The backend closed without releasing the role: its broker connection went with it.
    await gained(waiter)
    await waiter.release()

"""Every engine test ends with a leak check: each engine built during the test, or still alive from a
module fixture, must have no request in flight and pass ``check_integrity()``, which then asserts
that it holds no block and no state slot."""

import weakref

import pytest

from services.engine.engine_core import EngineCore

_ALIVE: "weakref.WeakSet[EngineCore]" = weakref.WeakSet()  # engines module fixtures keep
_BUILT_IN_TEST: list[EngineCore] = []  # strong references: engines a test builds and drops


@pytest.fixture(autouse=True, scope="session")
def _track_engines():
    original_init = EngineCore.__init__

    def tracking_init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        _ALIVE.add(self)
        _BUILT_IN_TEST.append(self)

    EngineCore.__init__ = tracking_init
    yield
    EngineCore.__init__ = original_init


@pytest.fixture(autouse=True)
def _engines_leak_nothing(_track_engines):
    _BUILT_IN_TEST.clear()
    yield
    engines = {id(engine): engine for engine in [*_ALIVE, *_BUILT_IN_TEST]}
    _BUILT_IN_TEST.clear()
    for engine in engines.values():
        assert not engine.has_unfinished, "a request was left in flight"
        engine.check_integrity()

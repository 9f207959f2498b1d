"""Every module's ``__all__`` names things that exist, and the package's lists exactly its public names."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

import harness


def test_every_module_exports_only_what_it_defines():
    names = [m.name for m in pkgutil.walk_packages(harness.__path__, "harness.") if not m.name.endswith("__main__")]
    assert "harness.loop" in names and "harness.backends.replay" in names
    optional = {"harness.executors.ray_cluster": "ray"}  # needs the [ray] extra; imported only under --executor ray
    for name in names:
        if name in optional and importlib.util.find_spec(optional[name]) is None:
            continue
        module = importlib.import_module(name)
        exported = getattr(module, "__all__", None)
        if name.rsplit(".", 1)[-1].startswith("_"):
            continue  # private modules (harness._plots) need no __all__
        assert exported is not None, f"{name} has no __all__"
        missing = [n for n in exported if not hasattr(module, n)]
        assert not missing, f"{name}.__all__ names missing attributes {missing}"


def test_package_api():
    public = {n for n in dir(harness) if not n.startswith("_") and not isinstance(getattr(harness, n), type(harness))}
    assert set(harness.__all__) == public

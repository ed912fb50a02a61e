"""Old import paths of the retrieval modules still work for one release, with a warning."""
import importlib
import subprocess
import sys

import pytest

from envs._moved import MOVED


@pytest.mark.parametrize("old_name", sorted(MOVED))
def test_old_path_is_the_new_module(old_name):
    new = importlib.import_module(MOVED[old_name])
    sys.modules.pop(old_name, None)
    with pytest.warns(DeprecationWarning, match=MOVED[old_name]):
        old = importlib.import_module(old_name)
    assert old is new
    assert new.__spec__.name == MOVED[old_name]  # the alias does not rebind the real module's spec


def test_patching_the_old_name_patches_the_new_module(monkeypatch):
    import envs.retrieval.defaults as new

    sys.modules.pop("envs.defaults", None)
    with pytest.warns(DeprecationWarning):
        importlib.import_module("envs.defaults")
    monkeypatch.setattr("envs.defaults.open_retriever", lambda *a, **kw: "patched")
    assert new.open_retriever() == "patched"


def test_python_dash_m_old_server_path_runs_the_server_cli():
    out = subprocess.run([sys.executable, "-W", "always::DeprecationWarning", "-m", "envs.server", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--index" in out.stdout and "moved to envs.retrieval.server" in out.stderr


def test_nothing_else_in_envs_is_aliased():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("envs.no_such_module")

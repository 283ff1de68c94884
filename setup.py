"""Build step for the one thing pyproject.toml cannot declare: ``openpop-lightning.pth``.

The file goes to the root of site-packages in regular and editable (PEP 660) installs. Python
runs it at start-up; it installs openpop's Lightning import hook (``src/openpop/lightning/hook.py``)
so that Lightning scripts need no import line to find ``IPUStrategy`` & co.
"""
import importlib.util
import os

from setuptools import setup
from setuptools.command.build_py import build_py


def _hook():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "src", "openpop", "lightning", "hook.py")
    spec = importlib.util.spec_from_file_location("_openpop_lightning_hook_build", path)
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)  # standard library only
    return hook


class build_py_with_pth(build_py):
    def run(self):
        super().run()
        hook = _hook()
        # Editable installs: setuptools points the install command at the unpacked editable
        # wheel, whose root becomes site-packages; regular builds: build_lib is the wheel root.
        target = self.build_lib
        if getattr(self, "editable_mode", False):
            target = self.get_finalized_command("install").install_lib
        os.makedirs(target, exist_ok=True)
        with open(os.path.join(target, hook.PTH_NAME), "w") as stream:
            stream.write(hook.PTH_LINE)
        self._pth_output = os.path.join(target, hook.PTH_NAME)

    def get_outputs(self, include_bytecode=1):
        outputs = super().get_outputs(include_bytecode)
        pth = getattr(self, "_pth_output", None)
        return outputs + [pth] if pth and not getattr(self, "editable_mode", False) else outputs


setup(cmdclass={"build_py": build_py_with_pth})

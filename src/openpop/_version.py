"""Version numbers.

``openpop_version`` is this project's release. ``poptorch_version`` is what
``poptorch.__version__`` reports: the PopTorch API level openpop implements
(3.4.0, the last Graphcore SDK), with openpop's release as a PEP 440 local part
so that scripts comparing versions keep working.
"""

openpop_version = "0.1.0"
poptorch_api_version = "3.4.0"
poptorch_version = f"{poptorch_api_version}+openpop{openpop_version.replace('.', '')}"

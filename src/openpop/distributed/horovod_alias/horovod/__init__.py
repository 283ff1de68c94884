"""Not horovod: openpop's horovod compatibility layer, put on the path of poprun's instances when
the real horovod is not installed (see ``openpop/distributed/horovod_compat.py``)."""
__version__ = "0.0.0+openpop.compat"

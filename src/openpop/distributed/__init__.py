"""Scale-out: ``poprun`` (a launcher on torchrun's elastic agent), the environment of its
instances, their torch.distributed process group and the horovod compatibility layer.

* ``instance.py``       the ``POPDIST_*`` environment of an instance; the launch shim (stdlib only)
* ``process_group.py``  the torch.distributed group of the instances, subgroups, timeouts
* ``topology.py``       poprun's topology table
* ``poprun.py``         the ``poprun`` command line: flags, validation, launch, faults, output tags
* ``horovod_compat.py`` the part of ``horovod.torch`` IPU-era scripts use, on torch.distributed

The cross-process gradient all-reduce lives in ``openpop.runtime.distributed_reduce``.
"""

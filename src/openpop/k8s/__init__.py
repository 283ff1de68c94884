"""openpop on Kubernetes: Graphcore ``IPUJob`` manifests and local commands as Kubeflow jobs.

``openpop-k8s convert`` turns ``IPUJob`` (``graphcore.ai/v1alpha1``) documents into a
``PyTorchJob`` (``kubeflow.org/v1``) or a ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``);
``render`` writes one for a command line; ``validate`` checks manifests; ``run-local`` runs a
Kubeflow job on this machine with the environment its controller would inject.

The pod command contract (what runs inside each pod)
-----------------------------------------------------
The worker's command is kept as written. When it runs ``poprun --num-instances I
--num-replicas R --ipus-per-replica K program ...``, the job has P pods and ``I / P``
processes per pod (``spec.nprocPerNode`` / ``spec.trainer.numProcPerNode``), and every pod
runs that same poprun command. openpop's ``poprun`` (torchrun-based) reads the rendezvous
environment the Kubeflow controller injects into the pod:

* ``PET_NNODES`` (P), ``PET_NODE_RANK`` (this pod's index), ``PET_NPROC_PER_NODE`` (I / P),
  ``PET_MASTER_ADDR`` and ``PET_MASTER_PORT`` (the rendezvous endpoint) -- both operators;
* ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` (I) and ``RANK`` (the pod's index, not a
  process rank) -- PyTorchJob only.

Inside a pod, poprun starts its ``PET_NPROC_PER_NODE`` local instances with global instance
indices ``PET_NODE_RANK * PET_NPROC_PER_NODE + local index``, checks that ``PET_NNODES *
PET_NPROC_PER_NODE == --num-instances``, and gives each instance ``R / I`` replicas of ``K``
virtual IPUs, mapped onto the GPUs the pod was given (split evenly among its instances) or
onto its CPUs. A command without poprun runs once per pod, with the same environment.
"""

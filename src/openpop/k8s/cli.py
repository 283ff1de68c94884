"""``openpop-k8s``: IPU-era Kubernetes jobs on Kubeflow (convert, render, validate, run-local).

Exit codes: 0 done; 1 a job run by ``run-local`` failed; 2 bad input (the error names the
offending field's path; nothing is written to stdout); 143 ``run-local`` was stopped by SIGTERM
(to one of its pods, or to ``openpop-k8s`` itself: what Kubernetes sends to stop a pod); 130
Ctrl-C.
"""

import argparse
import signal
import sys

from openpop.cli_help import HelpFormatter, examples
from openpop.k8s import messages
from openpop.k8s.convert import TARGETS, ConvertOptions, convert_documents, write_job
from openpop.k8s.documents import dump_documents, read_documents
from openpop.k8s.errors import ManifestError
from openpop.k8s.ipujob import is_ipujob, parse_ipujob
from openpop.k8s.render import plan_from_command
from openpop.k8s.report import ConversionReport, ReportLine
from openpop.k8s.run_local import JobFailed, JobStopped, prepare_local_job
from openpop.k8s.validation import validate_kubeflow_job

EXIT_JOB_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_SIGTERM = 128 + signal.SIGTERM


class _Terminated(Exception):
    """openpop-k8s received SIGTERM."""


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(messages.WHOLE_NUMBER.format(text=text)) from None
    if value < 1:
        raise argparse.ArgumentTypeError(messages.AT_LEAST_ONE.format(value=value))
    return value


def _target_options(parser):
    parser.add_argument("--to", choices=TARGETS, default="pytorchjob",
                        help="kubeflow.org/v1 PyTorchJob (training-operator 1.x) or "
                             "trainer.kubeflow.org/v1alpha1 TrainJob (Kubeflow Trainer 2.x)")
    parser.add_argument("--image", help="the container image of the pods (one with openpop installed)")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="what the virtual IPUs run on: CPU requests or nvidia.com/gpu")
    parser.add_argument("--pods", type=_positive_int, metavar="N",
                        help="spread poprun's --num-instances over this many pods "
                             "(the rest are processes per pod)")
    parser.add_argument("--gpus-per-pod", type=_positive_int, metavar="N",
                        help="nvidia.com/gpu per pod with --device gpu (default: one per IPU, at most 8)")
    parser.add_argument("--name", help="the job's name")
    parser.add_argument("--runtime", default="torch-distributed",
                        help="the TrainJob's ClusterTrainingRuntime")


def _options(args):
    return ConvertOptions(to=args.to, image=args.image, device=args.device, pods=args.pods,
                          gpus_per_pod=args.gpus_per_pod,
                          keep_ipc_lock=getattr(args, "keep_ipc_lock", False),
                          name=args.name, runtime=args.runtime)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="openpop-k8s", formatter_class=HelpFormatter,
        description="IPU-era Kubernetes jobs on Kubeflow: convert IPUJob manifests, render a job from a "
                    "command line, validate manifests, run a job on this machine.",
        epilog=examples("openpop-k8s convert ipujob.yaml --image ghcr.io/example/openpop:0.1 > pytorchjob.yaml",
                        "openpop-k8s run-local pytorchjob.yaml --dry-run"))
    commands = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")

    def command(name, help, *example):
        return commands.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".",
                                   formatter_class=HelpFormatter, epilog=examples(*example))

    convert = command("convert", "IPUJob manifest -> PyTorchJob / TrainJob",
                      "openpop-k8s convert ipujob.yaml --image ghcr.io/example/openpop:0.1 --pods 2 "
                      "> pytorchjob.yaml")
    convert.add_argument("manifest", help="a YAML file of IPUJob documents ('-': stdin)")
    _target_options(convert)
    convert.add_argument("--keep-ipc-lock", action="store_true",
                         help="keep the IPC_LOCK capability (removed by default)")

    render = command("render", "a command line -> PyTorchJob / TrainJob",
                     "openpop-k8s render --image ghcr.io/example/openpop:0.1 --name bert --num-instances 2 "
                     "--num-replicas 2 -- openpop-bert --config cpu_tiny_128")
    _target_options(render)
    for flag in ("--num-instances", "--num-replicas", "--ipus-per-replica"):
        render.add_argument(flag, type=_positive_int, metavar="N",
                            help=f"poprun's {flag}: run the command under poprun with it")
    render.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- then the command, e.g. -- poprun --num-instances 2 ... openpop-bert ...")

    validate = command("validate", "check IPUJob / PyTorchJob / TrainJob manifests",
                       "openpop-k8s validate pytorchjob.yaml")
    validate.add_argument("manifest", help="a YAML file of manifests ('-': stdin)")

    run = command("run-local", "run a PyTorchJob / TrainJob on this machine",
                  "openpop-k8s run-local pytorchjob.yaml --command 'openpop-bert --config cpu_tiny_128'")
    run.add_argument("manifest", help="a YAML file of PyTorchJob / TrainJob documents ('-': stdin)")
    run.add_argument("--command", help="run this command line in every pod instead of the "
                                       "container's command and args")
    run.add_argument("--master-port", type=_positive_int, metavar="PORT",
                     help="the rendezvous port to use instead of the job's (23456 / 29400)")
    run.add_argument("--dry-run", action="store_true",
                     help="print each pod's command line and environment; run nothing")
    run.add_argument("--allow-pod-commands", action="store_true",
                     help="run a pod command that installs packages or clones repositories "
                          "(apt, pip install, git clone, curl | sh) on this machine as written; "
                          "refused without it or --command")
    return parser


def _convert(args):
    manifests, report = convert_documents(read_documents(args.manifest), _options(args))
    return manifests, report


def _render(args):
    argv = args.command[1:] if args.command[:1] == ["--"] else args.command
    report = ConversionReport()
    topology = {"--num-instances": args.num_instances, "--num-replicas": args.num_replicas,
                "--ipus-per-replica": args.ipus_per_replica}
    options = _options(args)
    plan = plan_from_command(argv, options, report, topology)
    return [write_job(plan, options, report)], report


def _validate(args):
    report = ConversionReport()
    for index, document in enumerate(read_documents(args.manifest)):
        try:
            if is_ipujob(document):
                parse_ipujob(document)
                kind = "IPUJob"
            else:
                kind = validate_kubeflow_job(document)
        except ManifestError as exc:
            raise ManifestError(f"document {index}: {exc.path}", exc.reason) from None
        name = (document.get("metadata") or {}).get("name") or \
            (document.get("metadata") or {}).get("generateName")
        report.lines.append(ReportLine("valid", f"document {index}", f"{kind} {name}"))
    return report


def _run_local(args):
    documents = read_documents(args.manifest)
    jobs = []
    for index, document in enumerate(documents):
        try:
            jobs.append(prepare_local_job(document, command=args.command,
                                          master_port=args.master_port,
                                          allow_pod_commands=args.allow_pod_commands,
                                          dry_run=args.dry_run))
        except ManifestError as exc:
            path = f"document {index}: {exc.path}" if len(documents) > 1 else exc.path
            raise ManifestError(path, exc.reason) from None
    if args.dry_run:
        for job, notes in jobs:
            for note in notes:
                print(f"openpop-k8s: note: {note}", file=sys.stderr)
            print("\n".join(job.describe()))
        print("openpop-k8s: dry run: nothing was started", file=sys.stderr)
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        for job, notes in jobs:
            for note in notes:
                print(f"openpop-k8s: note: {note}", file=sys.stderr)
            pods = ", ".join(pod.name for pod in job.pods)
            print(f"openpop-k8s: running pods {pods}", file=sys.stderr)
            job.run()
            print(f"openpop-k8s: all {len(job.pods)} pods succeeded", file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_terminated(signum, frame):
    raise _Terminated


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        if args.subcommand in ("convert", "render"):
            manifests, report = _convert(args) if args.subcommand == "convert" else _render(args)
            text = dump_documents(manifests)
            report.write(sys.stderr)
            sys.stdout.write(text)
        elif args.subcommand == "validate":
            _validate(args).write(sys.stderr)
        else:
            _run_local(args)
    except ManifestError as exc:
        print(f"openpop-k8s: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except JobStopped as exc:
        print(f"openpop-k8s: {exc}", file=sys.stderr)
        return EXIT_SIGTERM
    except JobFailed as exc:
        print(f"openpop-k8s: error: {exc}", file=sys.stderr)
        return EXIT_JOB_FAILED
    except _Terminated:
        print(messages.RUN_LOCAL_TERMINATED, file=sys.stderr)
        return EXIT_SIGTERM
    except KeyboardInterrupt:
        print("openpop-k8s: interrupted: all pods stopped", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

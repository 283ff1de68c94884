"""``openpop-bert``'s command line: flags parsed and checked without loading torch (``--help``,
``--list-configs`` and usage errors answer at once), then the run (``train.py``).

A usage error prints two lines, the short usage and ``openpop-bert: error: <what to change>``,
and exits with status 2; errors of the run (data, checkpoints, PopTorch) exit with status 1.
"""
import sys
from typing import Optional

from .config import ConfigError, _ListConfigs, available_configs, build_parser, parse_args


def main(argv: Optional[list] = None) -> int:
    parser = build_parser()
    try:
        config = parse_args(argv, parser)
    except _ListConfigs:
        for name in available_configs():
            print(name)
        return 0
    except ConfigError as exc:
        parser.error(str(exc))  # exits with status 2
    from .train import run_command
    return run_command(config, parser.prog)


if __name__ == "__main__":
    sys.exit(main())

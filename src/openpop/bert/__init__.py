"""openpop-bert: Graphcore's BERT pretraining recipe (MLM + NSP) on openpop's runtime.

``openpop-bert --config demo_tiny_128 --dataset generated`` (or ``python -m openpop.bert ...``)
learns one random sample (the recipe's acceptance mark), ``--config cpu_tiny_128`` trains on real text; ``--help``
lists every flag. Needs the ``bert`` extra: ``pip install "openpop[bert]"``.

Modules: ``config`` (named configs, flags, validation), ``model`` (the split BERT),
``data`` (generated and real-text datasets), ``optimization``, ``metrics``, ``checkpoint``,
``train`` (the loop and its output).
"""
from .config import BertRunConfig, ConfigError, available_configs, make_config, parse_args

__all__ = ["BertRunConfig", "ConfigError", "available_configs", "main", "make_config", "parse_args", "run"]


def main(argv=None) -> int:
    from .cli import main as _main
    return _main(argv)


def run(config, stream=None):
    from .train import run as _run
    return _run(config, stream)

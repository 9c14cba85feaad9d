"""``--help`` examples: an epilog kept as written (line breaks matter in examples) under a
description that is still wrapped to the terminal."""

from __future__ import annotations

import argparse
import textwrap


def with_examples(parser: argparse.ArgumentParser, epilog: str) -> argparse.ArgumentParser:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    if parser.description:
        parser.description = textwrap.fill(parser.description, 88)
    parser.epilog = epilog
    return parser

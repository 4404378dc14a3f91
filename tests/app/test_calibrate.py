"""`python -m specgen.app.bench.calibrate` measures the pair it is given, and by default the shipped code pair: tree
drafts need a draft over the target's full vocabulary, so the default text model (Gemma with its reduced-vocabulary
draft, when the gemma extra is installed) cannot be calibrated or swept."""

import argparse

from specgen.app.bench.calibrate import _pair
from specgen.modalities.text.generator import shipped_code_pair


def test_the_default_pair_is_the_shipped_code_pair_whatever_extras_are_installed():
    assert _pair(argparse.Namespace(model=None, draft=None)) == shipped_code_pair()


def test_a_given_pair_is_kept():
    assert _pair(argparse.Namespace(model="m", draft="d")) == ("m", "d")
    assert _pair(argparse.Namespace(model="m", draft=None)) == ("m", None)

"""The seeded toy problem of the tests (:mod:`ctuq.bench.toy`), importable as ``toy_problem``."""

from ctuq.bench.toy import ToyProblem, toy_problem

__all__ = ["ToyProblem", "toy_problem"]

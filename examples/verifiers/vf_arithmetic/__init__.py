from vf_arithmetic.taskset import ArithmeticTaskset

__all__ = ["ArithmeticTaskset"]

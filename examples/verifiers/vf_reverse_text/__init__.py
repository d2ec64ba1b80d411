from vf_reverse_text.taskset import ReverseTextTaskset

__all__ = ["ReverseTextTaskset"]

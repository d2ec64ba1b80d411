from vf_tool_add.taskset import AddTaskset

__all__ = ["AddTaskset"]

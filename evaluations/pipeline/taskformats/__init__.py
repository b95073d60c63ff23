"""What is left here is grading's: tbparsers.py (a Terminal-Bench ``parser_name``'s grader). The task
formats themselves are read by evaluations/tasks/."""

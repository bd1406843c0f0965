"""Compare: baseline vs tree on the same prompts (run.py), the built-in prompts, and the report maths/files.

May import: service and the base modules (health, deploy, provision and hosts are not needed).
"""

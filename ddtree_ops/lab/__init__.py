"""The local lab fleet: Docker containers that behave like small bare-metal hosts (systemd + sshd)."""

from .fleet import LabDownReport, LabHost, LabReport, down, status, up
from .identity import Lab, default_lab_dir, lab_id

__all__ = ["Lab", "LabDownReport", "LabHost", "LabReport", "default_lab_dir", "down", "lab_id", "status", "up"]

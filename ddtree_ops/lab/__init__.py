"""The local lab fleet: Docker containers that behave like small bare-metal hosts (systemd + sshd)."""

from .fleet import Lab, LabDownReport, LabHost, LabReport, default_lab_dir, down, lab_id, status, up

__all__ = ["Lab", "LabDownReport", "LabHost", "LabReport", "default_lab_dir", "down", "lab_id", "status", "up"]

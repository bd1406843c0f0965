"""The local lab fleet: Docker containers that behave like small bare-metal hosts (systemd + sshd)."""

from .fleet import LabHost, LabReport, default_lab_dir, down, status, up

__all__ = ["LabHost", "LabReport", "default_lab_dir", "down", "status", "up"]

"""MODAK: plan, render and deploy optimised AI training jobs on HPC targets.

Every decision and every rendering lives in this package; it imports no Ansible.
"""
__version__ = "0.2.0"

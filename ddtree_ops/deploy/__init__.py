"""Deploy: plan (pure), rollout one host at a time behind the health gate, rollback, undeploy, and the
unit/env-file values (units.py).

May import: provision (the stored ABI manifest), hosts, service, and the base modules.
"""

"""Secrets at rest, environments and org variables (docs/design/admin.md §6, §6.1).

What other packages use:

- `SecretService` (published as `state.parts` (key `SECRETS`)): `secrets_for_job`,
  `source_secret`/`source_secrets`/`set_source_secret`, `encrypt_column`/`decrypt_column`,
  `environment`, `variables_for_job`, and `reveal` of an `ORG_SCOPE` secret (notification credentials).
- `check_environment_for_dispatch` (pure): `environment_not_found` / `environment_branch_not_allowed`.
- `secrets_for_job` / `variables_for_job` (pure merges), the errors `SecretIntegrityError` and
  `SecretKeyMissing`.
- `decode_key_bytes` (64 hex characters or base64 of 32 bytes) and `write_new_private_file` (a generated
  key file, mode 0600, created once): the provenance signing key reads and writes its seed the same way.
"""

from conveyor.secrets.crypto import SecretIntegrityError, decode_key_bytes
from conveyor.secrets.environments import Environment, EnvironmentRefusal, check_environment_for_dispatch
from conveyor.secrets.keys import SecretKeyMissing, write_new_private_file
from conveyor.secrets.resolve import secrets_for_job, variables_for_job
from conveyor.secrets.scopes import ORG_SCOPE
from conveyor.secrets.service import SECRETS, SecretService

__all__ = [
    "ORG_SCOPE",
    "SECRETS",
    "Environment",
    "EnvironmentRefusal",
    "SecretIntegrityError",
    "SecretKeyMissing",
    "SecretService",
    "check_environment_for_dispatch",
    "decode_key_bytes",
    "secrets_for_job",
    "variables_for_job",
    "write_new_private_file",
]

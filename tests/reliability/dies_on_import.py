"""A model module whose import ends the process (module-level code a user did not mean to run here)."""

import os

os._exit(7)

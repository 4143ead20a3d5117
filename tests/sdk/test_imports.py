"""``import sdk`` stays light: only grpcio, protobuf and the generated modules, none of the server."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "numpy", "services", "router", "cli", "kernels", "aiohttp")


def test_import_sdk_loads_no_server_package():
    probe = (
        "import json, sys; import sdk; "
        f"heavy = sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}); "
        "loaded = 'sdk.async_client' in sys.modules and 'grpc' in sys.modules; "
        "print(json.dumps({'heavy': heavy, 'sdk': loaded}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(result.stdout) == {"heavy": [], "sdk": True}

"""Root pytest wiring: the harness options (--tp --dp --ep --platform --device --preset
--wiring --save-data) and the queue runner's node collection (--collect-nodes)."""

pytest_plugins = ["harness.pytest_plugin", "ci.collect"]

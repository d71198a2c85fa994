"""The `docker` marker: tests that build and run the container images of docker/.

They need a Docker engine (and, the first time, several minutes to build the images); they are
skipped, with the reason, where none is reachable. Select them with `pytest -m docker`, leave
them out with `pytest -m "not docker"`.
"""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "docker: builds and runs the docker/ images; skipped when no Docker engine is reachable")

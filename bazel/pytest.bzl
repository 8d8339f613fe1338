"""`pytest_test`: a py_test that runs one test file under pytest with 8 emulated CPUs."""

load("@rules_python//python:defs.bzl", "py_test")
load("//bazel:test_deps.bzl", "TEST_DEPS")

def pytest_test(name, src, deps = [], data = [], size = "medium", **kwargs):
    py_test(
        name = name,
        srcs = ["//bazel:pytest_main.py", src],
        main = "//bazel:pytest_main.py",
        args = ["$(location %s)" % src],
        data = data + ["//tests:conftest"],
        deps = ["//:sao_jax"] + TEST_DEPS + deps,
        env = {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "8"},
        size = size,
        **kwargs
    )

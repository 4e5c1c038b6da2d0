"""Local model repository validation: what `pipeline models push` refuses, and why.

Pure file-system logic on ``tmp_path``; no services (the CLI test runs `pipeline
models push` with no store configured: the refusals come before any connection).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.modelstore.repository import DEFAULT_MAX_FILE_BYTES, LocalModel, scan_repository
from tests.helpers.cli import assert_one_line_error, run_cli

DENSE_CONFIG = """\
name: "dense"
backend: "python"
max_batch_size: 64
input [ { name: "features" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "probs" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 1000 }
"""


def make_model(
    root: Path,
    name: str,
    config: str | None = None,
    versions: dict[str, dict[str, str]] | None = None,
) -> Path:
    """Write ``root/name`` with a config (defaults to a valid one named ``name``) and version files."""
    model_dir = root / name
    model_dir.mkdir(parents=True)
    text = DENSE_CONFIG.replace('"dense"', f'"{name}"') if config is None else config
    (model_dir / "config.pbtxt").write_text(text)
    for version, files in (
        versions if versions is not None else {"1": {"model.py": "pass\n"}}
    ).items():
        (model_dir / version).mkdir()
        for rel, content in files.items():
            (model_dir / version / rel).parent.mkdir(parents=True, exist_ok=True)
            (model_dir / version / rel).write_text(content)
    return model_dir


def test_good_repository(tmp_path: Path) -> None:
    make_model(tmp_path, "b_model", versions={"1": {"model.py": "x"}, "3": {"w/weights.bin": "yy"}})
    make_model(tmp_path, "a_model")
    (tmp_path / "README.md").write_text("top-level files are not models")
    (tmp_path / ".hidden").mkdir()

    models = scan_repository(tmp_path)

    assert [m.name for m in models] == ["a_model", "b_model"]
    b = models[1]
    assert isinstance(b, LocalModel)
    assert b.versions == [1, 3]
    assert b.config.max_batch_size == 64
    assert b.config.input[0].name == "features"
    assert {f.relpath: f.size for f in b.files} == {
        "config.pbtxt": len(DENSE_CONFIG.replace('"dense"', '"b_model"')),
        "1/model.py": 1,
        "3/w/weights.bin": 2,
    }
    assert b.size == sum(f.size for f in b.files)


def test_single_model_directory(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "dense")
    (model_dir / "LICENSE").write_text("MIT")

    [model] = scan_repository(model_dir)

    assert model.name == "dense"
    assert model.path == model_dir
    assert sorted(f.relpath for f in model.files) == ["1/model.py", "LICENSE", "config.pbtxt"]


def test_config_without_name_takes_directory_name(tmp_path: Path) -> None:
    make_model(tmp_path, "unnamed", config=DENSE_CONFIG.replace('name: "dense"\n', ""))
    [model] = scan_repository(tmp_path)
    assert model.name == "unnamed"


def test_caches_and_hidden_files_are_not_uploaded(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "dense")
    (model_dir / "1" / "__pycache__").mkdir()
    (model_dir / "1" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    (model_dir / "1" / ".DS_Store").write_bytes(b"\0")
    [model] = scan_repository(tmp_path)
    assert sorted(f.relpath for f in model.files) == ["1/model.py", "config.pbtxt"]


def test_only_selects_models_and_ignores_broken_others(tmp_path: Path) -> None:
    make_model(tmp_path, "good")
    (tmp_path / "broken").mkdir()
    assert [m.name for m in scan_repository(tmp_path, only=["good"])] == ["good"]


def test_only_names_a_missing_model(tmp_path: Path) -> None:
    make_model(tmp_path, "good")
    with pytest.raises(ConfigError, match=r"no model directory named nope$"):
        scan_repository(tmp_path, only=["good", "nope"])


def test_missing_config(tmp_path: Path) -> None:
    make_model(tmp_path, "good")
    (tmp_path / "foo" / "1").mkdir(parents=True)
    (tmp_path / "foo" / "1" / "model.py").write_text("x")
    with pytest.raises(ConfigError) as info:
        scan_repository(tmp_path)
    assert str(info.value) == f"{tmp_path / 'foo'}: no config.pbtxt"


def test_bad_pbtxt_names_file_and_line(tmp_path: Path) -> None:
    bad = 'name: "bad"\nbackend: "python"\nmax_batch_sizee: 4\n'
    make_model(tmp_path, "bad", config=bad)
    with pytest.raises(ConfigError) as info:
        scan_repository(tmp_path)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'bad' / 'config.pbtxt'} line 3: ")
    assert "max_batch_sizee" in message
    assert "\n" not in message


def test_bad_pbtxt_value_type(tmp_path: Path) -> None:
    make_model(tmp_path, "bad", config='name: "bad"\nmax_batch_size: "many"\n')
    with pytest.raises(ConfigError, match=r"config\.pbtxt line 2: "):
        scan_repository(tmp_path)


def test_name_mismatch(tmp_path: Path) -> None:
    make_model(tmp_path, "folder_name", config=DENSE_CONFIG)  # config says "dense"
    with pytest.raises(ConfigError) as info:
        scan_repository(tmp_path)
    message = str(info.value)
    assert message.startswith(str(tmp_path / "folder_name" / "config.pbtxt"))
    assert '"dense"' in message and '"folder_name"' in message


def test_no_version_directory(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "dense", versions={})
    (model_dir / "not_a_version").mkdir()
    (model_dir / "not_a_version" / "x").write_text("x")
    with pytest.raises(ConfigError, match=r"dense: no version directory"):
        scan_repository(tmp_path)


def test_empty_version_directory(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "dense", versions={"1": {"model.py": "x"}, "2": {}})
    with pytest.raises(ConfigError) as info:
        scan_repository(tmp_path)
    assert str(info.value) == f"{model_dir / '2'}: empty version directory"


def test_version_with_only_cache_files_is_empty(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "dense", versions={"1": {"__pycache__/m.pyc": "x"}})
    with pytest.raises(ConfigError, match="empty version directory"):
        scan_repository(model_dir)


def test_version_policy_names_missing_version(tmp_path: Path) -> None:
    config = DENSE_CONFIG + "version_policy { specific { versions: [ 1, 2 ] } }\n"
    make_model(tmp_path, "dense", config=config)
    with pytest.raises(ConfigError, match=r"version_policy names version\(s\) 2"):
        scan_repository(tmp_path)


def test_nonexistent_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigError) as info:
        scan_repository(missing)
    assert str(info.value) == f"{missing}: no such directory"


def test_path_is_a_file(tmp_path: Path) -> None:
    file = tmp_path / "config.pbtxt"
    file.write_text("")
    with pytest.raises(ConfigError, match="not a directory"):
        scan_repository(file)


def test_empty_repository(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no model directories"):
        scan_repository(tmp_path)


# --------------------------------------------------------------------------- what a push must never upload


def test_link_out_of_the_model_folder_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "home" / "credentials"
    outside.parent.mkdir()
    outside.write_text("not for the bucket")
    repo = tmp_path / "repo"
    model_dir = make_model(repo, "dense")
    (model_dir / "1" / "weights.bin").symlink_to(outside)
    with pytest.raises(ConfigError) as info:
        scan_repository(repo)
    assert str(info.value) == (
        f"{model_dir / '1' / 'weights.bin'}: symbolic link to {outside} points outside {model_dir}; "
        "copy the file in instead"
    )


def test_links_out_are_refused_for_folders_configs_and_model_directories(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    make_model(outside, "stolen")
    (outside / "config.pbtxt").write_text("secret: 1\n")  # a parse error would quote it
    repo = tmp_path / "repo"

    model_dir = make_model(repo, "dense")
    (model_dir / "1" / "data").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ConfigError, match=r"1/data: symbolic link to .* points outside"):
        scan_repository(repo)
    (model_dir / "1" / "data").unlink()

    (model_dir / "config.pbtxt").unlink()
    (model_dir / "config.pbtxt").symlink_to(outside / "config.pbtxt")
    with pytest.raises(ConfigError, match=r"dense/config\.pbtxt: symbolic link to .* points outside") as info:
        scan_repository(repo)
    assert "secret" not in str(info.value)

    (repo / "linked").symlink_to(outside / "stolen", target_is_directory=True)
    with pytest.raises(ConfigError, match=rf"^{repo / 'linked'}: symbolic link to .* points outside {repo}"):
        scan_repository(repo, only=["linked"])


def test_links_inside_the_model_folder_are_followed(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "dense", versions={"1": {"model.onnx": "weights"}, "2": {"model.py": "x"}})
    (model_dir / "2" / "model.onnx").symlink_to("../1/model.onnx")  # versions sharing weights
    [model] = scan_repository(model_dir)
    shared = {f.relpath: f.size for f in model.files}
    assert shared["2/model.onnx"] == shared["1/model.onnx"] == len("weights")


def test_broken_links_and_loops_are_refused(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "dense")
    (model_dir / "1" / "gone.bin").symlink_to(model_dir / "1" / "never-there")
    with pytest.raises(ConfigError, match=r"1/gone\.bin: symbolic link cannot be resolved \(broken, or a loop\)$"):
        scan_repository(model_dir)
    (model_dir / "1" / "gone.bin").unlink()
    (model_dir / "1" / "again").symlink_to("..", target_is_directory=True)  # would recurse forever
    with pytest.raises(ConfigError, match=r"1/again: symbolic link to .* contains itself \(a loop\)$"):
        scan_repository(model_dir)


def _sparse(path: Path, size: int) -> None:
    """A file of ``size`` bytes that takes no disk space."""
    with path.open("wb") as fh:
        fh.truncate(size)


def test_a_file_over_the_limit_is_refused_with_the_limit_named(tmp_path: Path) -> None:
    model_dir = make_model(tmp_path, "dense")
    _sparse(model_dir / "1" / "weights.bin", DEFAULT_MAX_FILE_BYTES)
    [model] = scan_repository(model_dir)  # exactly the limit is fine
    assert {f.relpath: f.size for f in model.files}["1/weights.bin"] == 2 * 1024**3

    _sparse(model_dir / "1" / "weights.bin", DEFAULT_MAX_FILE_BYTES + 1)
    with pytest.raises(ConfigError) as info:
        scan_repository(model_dir)
    assert str(info.value) == (
        f"{model_dir / '1' / 'weights.bin'}: 2147483649 bytes is over the per-file limit of "
        "2147483648 bytes (2.0GiB; raise it with --max-file-size)"
    )
    [model] = scan_repository(model_dir, max_file_bytes=DEFAULT_MAX_FILE_BYTES + 1)
    assert model.size > DEFAULT_MAX_FILE_BYTES


def test_push_refuses_before_looking_for_a_store(tmp_path: Path) -> None:
    """The CLI path: one line naming the file, exit 1, and no S3 endpoint needed to say so."""
    model_dir = make_model(tmp_path / "repo", "dense")
    _sparse(model_dir / "1" / "weights.bin", 1001)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIPELINE_", "AWS_"))}
    env["PIPELINE_STATE_DIR"] = str(tmp_path / "no-stack")

    too_big = run_cli(env, "models", "push", str(model_dir), "--max-file-size", "1kB")
    line = assert_one_line_error(too_big, "1001 bytes is over the per-file limit of 1000 bytes")
    assert str(model_dir / "1" / "weights.bin") in line

    (model_dir / "1" / "weights.bin").unlink()
    (model_dir / "1" / "weights.bin").symlink_to(tmp_path)
    linked = run_cli({**env, "PIPELINE_MODELS_MAX_FILE_SIZE": "1kB"}, "models", "push", str(model_dir))
    assert_one_line_error(linked, f"{model_dir / '1' / 'weights.bin'}: symbolic link to {tmp_path} points outside")

    bad_size = run_cli(env, "models", "push", str(model_dir), "--max-file-size", "lots")
    assert bad_size.returncode == 2 and "'lots' is not a size" in bad_size.stderr

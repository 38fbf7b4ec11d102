"""hcrfast.train: a short digits training, the saved state dict, determinism, accuracy."""
from __future__ import annotations

import os

import pytest
import torch

from hcrfast import data, train, zoo


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("train") / "digits.pt"
    # 8 epochs instead of the default 30: ≈0.95 test accuracy in well under a second.
    return train.train("digits", epochs=8, out=out, progress=False)


def test_short_digits_training_learns(short_run):
    assert short_run.epochs == 8
    assert short_run.test_accuracy > 0.8  # chance is 0.1
    assert short_run.train_seconds > 0
    assert short_run.state_dict_path.is_file()


def test_saved_state_dict_loads_back_with_identical_logits(short_run):
    loaded = zoo.build("digits", weights=short_run.state_dict_path)
    images, labels = data.load("digits")
    saved = torch.load(short_run.state_dict_path, map_location="cpu", weights_only=True)
    assert set(saved) == set(loaded.model.state_dict())
    # the same logits as a model holding the saved tensors directly
    reference = zoo.build("digits", seed=123)
    reference.model.load_state_dict(saved)
    with torch.no_grad():
        assert torch.equal(loaded.model(loaded.normalize(images)), reference.model(reference.normalize(images)))
    assert train.accuracy(loaded, images, labels) == pytest.approx(short_run.test_accuracy)


def test_training_is_deterministic(short_run, tmp_path):
    again = train.train("digits", epochs=8, out=tmp_path / "again.pt", progress=False)
    a = torch.load(short_run.state_dict_path, weights_only=True)
    b = torch.load(again.state_dict_path, weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert again.test_accuracy == short_run.test_accuracy
    other = train.train("digits", epochs=1, seed=1, out=tmp_path / "other.pt", progress=False, limit=64)
    c = torch.load(other.state_dict_path, weights_only=True)
    assert not torch.equal(a["1.weight"], c["1.weight"])


def test_progress_one_line_per_epoch(tmp_path, capsys):
    train.train("digits", epochs=2, out=tmp_path / "p.pt", limit=64)
    err = capsys.readouterr().err.strip().splitlines()
    epoch_lines = [line for line in err if "epoch" in line]
    assert len(epoch_lines) == 2
    assert "loss" in epoch_lines[0] and "accuracy" in epoch_lines[0]
    assert "ETA" in epoch_lines[0] and "ETA" not in epoch_lines[1]  # none once the last epoch is done


def test_accuracy_oracle():
    # a fixed linear "model" whose predictions are known
    model = torch.nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(2))
    images = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 1.0], [0.0, 3.0], [5.0, 4.0]])
    labels = torch.tensor([0, 1, 1, 1, 0])
    assert train.accuracy(model, images, labels, batch_size=2) == pytest.approx(4 / 5)


def test_refuses_imagenet_and_unknown_names(tmp_path):
    with pytest.raises(NotImplementedError, match="weights='default'"):
        train.train("resnet18", out=tmp_path / "x.pt")
    with pytest.raises(ValueError, match="trainable names"):
        train.train("vgg", out=tmp_path / "x.pt")
    with pytest.raises(ValueError, match="epochs"):
        train.train("digits", epochs=0, out=tmp_path / "x.pt")


@pytest.mark.parametrize("lr", [float("inf"), float("nan"), 0.0, -1e-3, True, "1e-3"])
def test_refuses_a_learning_rate_that_is_not_positive_and_finite(lr, tmp_path):
    with pytest.raises(ValueError, match=r"lr must be a positive finite number"):
        train.train("digits", epochs=1, lr=lr, out=tmp_path / "x.pt", limit=64, progress=False)
    assert not (tmp_path / "x.pt").exists()


def test_a_diverged_run_writes_no_state_dict(tmp_path):
    """lr = 1e6 turns the weights into NaN within two epochs: refused, nothing saved (it was saved, rc 0)."""
    with pytest.raises(ValueError, match=r"digits training diverged at epoch [12] .*no state dict was written"):
        train.train("digits", epochs=2, lr=1e6, out=tmp_path / "x.pt", limit=64, progress=False)
    assert not (tmp_path / "x.pt").exists()


def _interrupted(monkeypatch, after_epochs: int, **kw):
    """A training killed (KeyboardInterrupt) as epoch ``after_epochs + 1`` starts: each epoch draws its
    order with one torch.randperm call."""
    calls = {"n": 0}
    randperm = torch.randperm

    def dying(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > after_epochs:
            raise KeyboardInterrupt
        return randperm(*args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(torch, "randperm", dying)
        with pytest.raises(KeyboardInterrupt):
            train.train("digits", progress=False, **kw)


def test_an_interrupted_run_resumes_to_the_uninterrupted_weights(tmp_path, monkeypatch, capsys):
    """The state dict of a run killed after epoch 2 of 4 and made again equals that of one run of 4 epochs,
    bitwise (model, AdamW's moments and step, the shuffling generator all resume); the second call trains
    only epochs 3 and 4, and the resume file goes once the state dict is written."""
    kw = dict(epochs=4, limit=256)
    whole = train.train("digits", out=tmp_path / "whole.pt", progress=False, **kw)
    out = tmp_path / "resumed.pt"
    _interrupted(monkeypatch, 2, out=out, **kw)
    assert not out.exists() and train.resume_path(out).is_file()
    capsys.readouterr()
    resumed = train.train("digits", out=out, **kw)
    err = capsys.readouterr().err
    assert "resuming after epoch 2/4" in err
    assert [line.split(":")[0] for line in err.splitlines() if " epoch " in line and "loss" in line] == [
        "digits epoch 3/4", "digits epoch 4/4"]
    a, b = (torch.load(r.state_dict_path, weights_only=True) for r in (whole, resumed))
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.test_accuracy == whole.test_accuracy
    assert not train.resume_path(out).exists()


def test_a_resumed_run_can_be_extended_but_not_changed(tmp_path, monkeypatch):
    """More epochs extend the interrupted run (the recipe has no schedule: 2 epochs then 3 more are the
    weights of 5); other arguments or data are refused, naming the difference, with the file kept."""
    out = tmp_path / "m.pt"
    _interrupted(monkeypatch, 2, out=out, epochs=3, limit=128)
    with pytest.raises(train.CheckpointMismatchError, match=r"lr: 0.001 -> 0.002.*Delete .*m.pt.resume"):
        train.train("digits", out=out, epochs=3, limit=128, lr=2e-3, progress=False)
    with pytest.raises(train.CheckpointMismatchError, match=r"train_examples: 128 -> 64"):
        train.train("digits", out=out, epochs=3, limit=64, progress=False)
    with pytest.raises(train.CheckpointMismatchError, match=r"trained for 2 epochs, more than the 1 asked"):
        train.train("digits", out=out, epochs=1, limit=128, progress=False)
    assert train.resume_path(out).is_file()
    longer = train.train("digits", out=out, epochs=5, limit=128, progress=False)
    whole = train.train("digits", out=tmp_path / "whole.pt", epochs=5, limit=128, progress=False)
    a, b = (torch.load(r.state_dict_path, weights_only=True) for r in (whole, longer))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_damaged_resume_file_is_refused_with_the_fix(tmp_path):
    out = tmp_path / "m.pt"
    train.resume_path(out).write_bytes(b"not a torch file")
    with pytest.raises(train.CheckpointMismatchError, match=r"not a resumable run of hcrfast train.*Delete"):
        train.train("digits", out=out, epochs=1, limit=64, progress=False)


def test_train_digits_with_download_ignores_it_as_reproduce_does(tmp_path):
    """``hcrfast reproduce digits --download`` notes the flag is ignored (digits ships with scikit-learn);
    ``hcrfast train digits --download`` failed (download=True is supported for mnist and cifar10 only)."""
    with pytest.warns(UserWarning, match=r"download=True ignored: digits is not downloadable"):
        train.train("digits", epochs=1, out=tmp_path / "d.pt", download=True, progress=False)
    assert (tmp_path / "d.pt").is_file()


def test_an_interrupted_train_names_the_resume(monkeypatch, tmp_path, capsys):
    """Ctrl-C in ``hcrfast train`` said only "interrupted", though OUT.resume is kept and the same command
    resumes (reproduce and bound said so)."""
    from hcrfast import cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "train", interrupted)
    assert cli.main(["train", "digits", "--epochs", "1", "--out", str(tmp_path / "d.pt")]) == 130
    assert "the same command resumes" in capsys.readouterr().err


def test_a_tilde_after_an_equals_sign_is_the_home_folder(tmp_path, monkeypatch):
    """hcrfast train --out=~/d.pt: the shell leaves ~ after '=', so hcrfast expands it, never making a folder
    named ~ in the working directory."""
    from hcrfast import cli

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "digits", "--epochs", "1", "--out=~/d.pt", "--quiet"]) == 0
    assert (home / "d.pt").is_file() and not (tmp_path / "~").exists()


@pytest.mark.parametrize("device", ["meta", "mps", "xla", "cuda:x", "gpu"])
def test_train_refuses_a_device_bound_and_reproduce_refuse_with_argparses_message(device, tmp_path, capsys):
    """`hcrfast train digits --device meta` (mps, xla) ended in a 10-frame RuntimeError traceback from inside the
    training loop, where bound and reproduce take only cpu or cuda; train keeps cuda:N (a GPU of several)."""
    from hcrfast import cli

    with pytest.raises(SystemExit) as exc:
        cli.main(["train", "digits", "--epochs", "1", "--limit", "10", "--device", device,
                  "--out", str(tmp_path / "d.pt")])
    assert exc.value.code == 2
    assert f"--device: invalid choice: '{device}' (choose from " in capsys.readouterr().err
    assert not (tmp_path / "d.pt").exists()
    assert cli.build_parser().parse_args(["train", "digits"]).device == "cpu"
    assert cli.build_parser().parse_args(["train", "digits", "--device", "cuda:1"]).device == "cuda:1"
    with pytest.raises(ValueError, match=r"device 'meta': train runs on cpu or cuda"):
        train.train("digits", epochs=1, device="meta", out=str(tmp_path / "d.pt"))


def test_train_takes_no_progress_as_the_other_commands_spell_it():
    from hcrfast import cli

    parse = cli.build_parser().parse_args
    assert parse(["train", "digits", "--no-progress"]).quiet is True
    assert parse(["train", "digits", "--quiet"]).quiet is True
    assert parse(["train", "digits"]).quiet is False


def _user_files(folder):
    """Files of the user's at an --out name, none written by hcrfast train: text, a state dict saved as torch's
    docs say (torch.save(model.state_dict(), path), of the very model train trains) and another model's."""
    files = {"notes.pt": b"my precious weights\n"}
    for name, module in (("mine.pt", zoo.build("digits", seed=5).model), ("other.pt", torch.nn.Linear(3, 2))):
        torch.save(module.state_dict(), folder / name)
        files[name] = (folder / name).read_bytes()
    (folder / "notes.pt").write_bytes(files["notes.pt"])
    return files


def test_a_file_of_the_user_s_at_out_is_refused_and_left_as_it_was(tmp_path, capsys):
    """`hcrfast train digits --out mine.pt` wrote over a file it never wrote (bound and reproduce refuse that)."""
    from hcrfast import cli

    for name, before in _user_files(tmp_path).items():
        out = tmp_path / name
        assert cli.main(["train", "digits", "--epochs", "1", "--limit", "64", "--out", str(out), "--quiet"]) == 2
        assert capsys.readouterr().err == (f"hcrfast: error: {out} is there and is not a state dict hcrfast train "
                                           f"wrote: it would be written over; pass another --out, or remove it\n")
        assert out.read_bytes() == before and not train.resume_path(out).exists()
        with pytest.raises(ValueError, match="is not a state dict hcrfast train wrote"):
            train.train("digits", epochs=1, limit=64, out=out, progress=False)
        assert out.read_bytes() == before


def test_a_rerun_writes_over_train_s_own_out(tmp_path, capsys):
    """A finished run is not extended: the same command trains from the start and replaces its own OUT, as one
    from an hcrfast before train marked its state dicts (a plain dict of the model's tensors) does."""
    from hcrfast import cli

    out = tmp_path / "d.pt"
    argv = ["train", "digits", "--limit", "64", "--out", str(out), "--quiet"]
    assert cli.main([*argv, "--epochs", "1"]) == 0
    one = out.read_bytes()
    assert cli.main([*argv, "--epochs", "2"]) == 0
    two = torch.load(out, weights_only=True)
    assert out.read_bytes() != one
    whole = train.train("digits", epochs=2, limit=64, out=tmp_path / "whole.pt", progress=False)
    expected = torch.load(whole.state_dict_path, weights_only=True)
    assert set(two) == set(expected) and all(torch.equal(two[k], expected[k]) for k in two)
    torch.save(dict(expected), out)   # an earlier hcrfast's OUT
    assert cli.main([*argv, "--epochs", "1"]) == 0
    assert out.read_bytes() == one
    capsys.readouterr()


def test_a_long_state_dict_name_trains_resumes_and_a_too_long_one_is_refused_first(tmp_path, monkeypatch):
    """A name of 250 bytes (the file system takes 255) failed at the first epoch's end: "OUT.resume" and the
    temporary ".OUT.PID.tmp" were longer than the file system takes. They are shortened now, and the run
    resumes from them; a name past the limit itself is refused before any training, naming the limit."""
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    out = tmp_path / ("m" * (limit - 5) + ".pt")
    kw = dict(epochs=2, limit=64)
    _interrupted(monkeypatch, 1, out=out, **kw)
    resume = train.resume_path(out)
    assert resume.is_file() and len(resume.name) <= limit and resume.name.endswith(".resume")
    resumed = train.train("digits", out=out, progress=False, **kw)
    whole = train.train("digits", out=tmp_path / "whole.pt", progress=False, **kw)
    a, b = (torch.load(r.state_dict_path, weights_only=True) for r in (whole, resumed))
    assert all(torch.equal(a[k], b[k]) for k in a) and not resume.exists()
    with pytest.raises(ValueError, match=f"its name is {limit + 1} bytes.*takes names of {limit} bytes at most"):
        train.train("digits", out=tmp_path / ("m" * (limit - 2) + ".pt"), progress=False, **kw)

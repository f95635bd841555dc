"""One epoch's worth of samples per data set."""

from pipecast.values.data.registry import DEFAULT_EPOCH_SAMPLES, dataset_names, epoch_samples


def test_an_epoch_is_the_training_split_where_there_is_one() -> None:
    assert epoch_samples("imagenet") == 1_281_167
    assert epoch_samples("cifar10") == 50_000
    assert epoch_samples("mnist") == 60_000
    # the shipped digits set: scikit-learn's 1,797 images
    assert epoch_samples("digits") == 1_797
    # synthetic sets have no split of their own
    assert epoch_samples("tokens") == DEFAULT_EPOCH_SAMPLES
    assert all(epoch_samples(name) > 0 for name in dataset_names())

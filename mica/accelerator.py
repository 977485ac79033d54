"""torch.accelerator: the script's question "which accelerator is there?" (the Quickstart's
`torch.accelerator.current_accelerator().type if torch.accelerator.is_available() else "cpu"`).
A Mica program runs where it is built: on the CPU, or on an NVIDIA card through the CUDA target
(mica.compile(..., target="cuda"), `mica train --device=cuda`), which no eager tensor lives on; so,
as torch without an accelerator answers, none is available and the device is the CPU."""


def is_available():
    return False


def current_accelerator(check_available=False):
    return None


def device_count():
    return 0


def current_device_index():
    return -1


def synchronize(device=None):
    return None

"""The reference interpreter (see spec/): executes a TileProgram on numpy."""

from ..errors import NotAvailableError


def interpret(program_or_kernel, *arrays, **kw):
    raise NotAvailableError("the reference interpreter is not available in this build yet",
                            hint="capture and inspect the program with `tilenest show FILE`")

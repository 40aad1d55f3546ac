"""The transformations, one module each: every module here defines `TRANSFORMATION` (see
`kbv.redteam`), and `kbv.redteam.discover` finds it by listing this package."""

"""Engine builds as jobs of their own (a spec's `build:` section, hpc/spec/build.py): what is built and whether
it is cached (`plan`), the job's script (`script`), submitting and reading it (`run`), `hpc-serve build` (`cli`).
DEVELOPERS.md "Building engines" has the whole picture."""

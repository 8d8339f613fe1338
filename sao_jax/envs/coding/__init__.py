"""SWE-style coding agent: the environment (`env`), its file tools (`tools`), the
test runner (`runner`), task formats (`tasks`), generated tasks (`generator`,
with planted bugs from `bugs`)."""

// Renders the math pymdownx.arithmatex (generic mode) leaves as \( \) and \[ \] in
// <span>/<div class="arithmatex">, with the KaTeX vendored under assets/vendor/katex
// (no network). document$ is mkdocs-material's page observable: it fires on every
// page, instant navigation included.
document$.subscribe(({ body }) => {
  renderMathInElement(body, {
    delimiters: [
      { left: "\\(", right: "\\)", display: false },
      { left: "\\[", right: "\\]", display: true },
    ],
    throwOnError: false,
  });
});

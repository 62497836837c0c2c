"""Renders, lints and validates the Helm chart: run with the Python of `.venv-helm` (helm-python-sdk and
kubernetes-validate), never imported by the test suite itself.

    BEAR_HELM_PYTHON helm_driver.py < request.json > report.json

Request: {"chart": DIR, "kube_versions": ["1.35.0", ...], "cases": [{"name": ..., "values_files": [FILE, ...],
"values": {...}, "release": ..., "namespace": ...}]}. Values files are merged in order as `helm -f` does (mappings
deeply, everything else replaced), then `values` on top. Report, per case name: {"schema_error": str | null,
"render_error": str | null, "lint": {...}, "manifests": {template: text}, "invalid": [str]} where `invalid` lists
every rendered object that kubernetes-validate (strict: unknown fields are errors) rejects for any of the versions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import helm_python as helm
import kubernetes_validate
import yaml


def merged(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def invalid_objects(manifests: dict[str, str], kube_versions: list[str]) -> list[str]:
    problems = []
    for template, text in sorted(manifests.items()):
        if not template.endswith((".yaml", ".yml")):
            continue  # NOTES.txt
        for document in yaml.safe_load_all(text):
            if not document:
                continue
            where = f"{template}: {document.get('kind')}/{document.get('metadata', {}).get('name')}"
            for version in kube_versions:
                try:
                    kubernetes_validate.validate(document, version, strict=True)
                except kubernetes_validate.ValidationError as error:
                    path = "/".join(str(part) for part in error.path)
                    problems.append(f"{where} (Kubernetes {version}) at {path or '.'}: {error.message}")
                except kubernetes_validate.SchemaNotFoundError as error:
                    problems.append(f"{where} (Kubernetes {version}): {error.message}")
    return problems


def run_case(chart: helm.Chart, chart_dir: str, kube_versions: list[str], case: dict[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for path in case.get("values_files", []):
        values = merged(values, helm.values_from_yaml(Path(path).read_text()))
    values = merged(values, case.get("values", {}))
    report: dict[str, Any] = {"schema_error": None, "render_error": None, "lint": None, "manifests": {},
                              "invalid": []}
    try:
        chart.validate_schema(chart.merge_values(values))
    except helm.HelmError as error:
        report["schema_error"] = str(error)
        return report
    report["lint"] = helm.lint(chart_dir, values, strict=True, namespace=case.get("namespace", "default"),
                               kube_version=f"v{kube_versions[-1]}")
    try:
        report["manifests"] = chart.render(values, name=case.get("release", "bear"),
                                           namespace=case.get("namespace", "default"), is_install=True)
    except helm.HelmError as error:
        report["render_error"] = str(error)
        return report
    report["invalid"] = invalid_objects(report["manifests"], kube_versions)
    return report


def main() -> None:
    request = json.load(sys.stdin)
    with helm.Chart.load(request["chart"]) as chart:
        report = {case["name"]: run_case(chart, request["chart"], request["kube_versions"], case)
                  for case in request["cases"]}
    json.dump({"helm_sdk_version": helm.helm_sdk_version(), "cases": report}, sys.stdout)


if __name__ == "__main__":
    main()

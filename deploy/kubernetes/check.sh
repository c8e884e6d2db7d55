#!/bin/sh
# Validates the Kubernetes manifests against the Kubernetes API's own schemas, offline:
#   1. the OpenAPI spec of the Kubernetes release (api/openapi-spec/swagger.json of the module
#      k8s.io/kubernetes, fetched once through the Go module proxy) is turned into kubeconform's
#      schema layout under .cache/ (gitignored): one file per kind referring to a shared
#      _definitions.json, strict (unknown fields are errors), with int-or-string and quantity
#      fields accepting numbers too, as the API server does;
#   2. the Kustomize base is built (kubectl kustomize, or kustomize from the Go module proxy
#      where kubectl is missing) and validated with kubeconform together with the examples.
# Needs go and jq. Usage: deploy/kubernetes/check.sh (from anywhere).
set -eu

K8S_VERSION=v1.33.1
KUBECONFORM=github.com/yannh/kubeconform/cmd/kubeconform@v0.8.0
KUSTOMIZE=sigs.k8s.io/kustomize/kustomize/v5@v5.7.1

root=$(cd "$(dirname "$0")/../.." && pwd)
schemas=$root/.cache/kubernetes-schemas/$K8S_VERSION
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ ! -s "$schemas/_definitions.json" ]; then
	# Outside the repository's module, so go.mod and go.sum stay as they are.
	dir=$(cd "$tmp" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | jq -r '.Dir // empty')
	spec=$dir/api/openapi-spec/swagger.json
	[ -s "$spec" ] || { echo "check.sh: no OpenAPI spec in k8s.io/kubernetes@$K8S_VERSION" >&2; exit 1; }
	mkdir -p "$schemas.tmp"
	jq '{definitions: (.definitions
		| map_values(if has("properties") and (has("additionalProperties") | not)
			then .additionalProperties = false else . end)
		| .["io.k8s.apimachinery.pkg.util.intstr.IntOrString"] = {oneOf: [{type: "string"}, {type: "integer"}]}
		| .["io.k8s.apimachinery.pkg.api.resource.Quantity"] = {oneOf: [{type: "string"}, {type: "number"}]})}' \
		"$spec" > "$schemas.tmp/_definitions.json"
	jq -r '.definitions | to_entries[] | .key as $name | .value["x-kubernetes-group-version-kind"][]?
		| [$name, ((.kind | ascii_downcase) + "-"
			+ (if .group == "" then "" else (.group | split(".")[0]) + "-" end) + .version)] | @tsv' \
		"$spec" > "$tmp/kinds.tsv"
	while IFS='	' read -r name file; do
		printf '{"$ref": "_definitions.json#/definitions/%s"}\n' "$name" > "$schemas.tmp/$file.json"
	done < "$tmp/kinds.tsv"
	rm -rf "$schemas" && mv "$schemas.tmp" "$schemas"
fi

if command -v kubectl >/dev/null 2>&1; then
	kubectl kustomize "$root/deploy/kubernetes/base" > "$tmp/base.yaml"
else
	(cd "$tmp" && go run "$KUSTOMIZE" build "$root/deploy/kubernetes/base") > "$tmp/base.yaml"
fi

(cd "$tmp" && go run "$KUBECONFORM" -strict -summary -output text \
	-schema-location "$schemas/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
	"$tmp/base.yaml" "$root"/deploy/kubernetes/examples/*.yaml)

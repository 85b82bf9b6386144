package doccheck

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"testing/fstest"
)

// TestRepositoryReferencesResolve is the acceptance check: nothing in the
// repository's Markdown, Go comments or served documents points at a contract, an
// issue or a path the repository does not contain, and every link into it lands on
// a file and a section that exist.
func TestRepositoryReferencesResolve(t *testing.T) {
	t.Parallel()
	root := moduleRoot(t)
	r, err := Load(os.DirFS(root))
	if err != nil {
		t.Fatal(err)
	}
	findings, err := r.Check()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range findings {
		t.Errorf("%s", f)
	}
	if len(findings) > 0 {
		t.Logf("%d references a reader of the repository cannot follow: cite the repository's own docs/ pages (docs/contracts/*.md), never a contract number, an issue number or a path outside it", len(findings))
	}
	// A walk that found nothing to read would pass vacuously.
	for _, p := range []string{"README.md", "docs/contracts/README.md", "internal/railproxy/admission.go"} {
		if !r.paths[p] {
			t.Errorf("the walk from %s did not find %s", root, p)
		}
	}
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

// TestPlantedReferences plants one reference in an otherwise clean repository
// and names the finding it must give, or none: the check fails on each kind of bad
// reference and passes the look-alikes the repository legitimately holds.
func TestPlantedReferences(t *testing.T) {
	t.Parallel()
	base := fstest.MapFS{
		"go.mod":                   {Data: []byte("module example\n")},
		"README.md":                {Data: []byte("# Example\n\nSee [the contracts](docs/contracts/README.md).\n")},
		"docs/contracts/README.md": {Data: []byte("# Contracts\n\n## Who may do what\n\n## `lock-server certs` — a throwaway authority, for demos\n\n## Notes\n\n## Notes\n")},
		"docs/operations/a.md":     {Data: []byte("# A\n")},
		"internal/x/x.go":          {Data: []byte("package x\n")},
	}
	cases := []struct {
		name, file, text string
		want             string // the finding's kind; "" for none
	}{
		{"contract number in prose", "docs/a.md", "The gate follows C3 exactly.\n", KindContractNumber},
		{"contract number in parentheses", "docs/a.md", "Settles are idempotent (C6).\n", KindContractNumber},
		{"C10 in a report excerpt", "docs/a.md", "```text\nadapters (C10)\n```\n", KindContractNumber},
		{"contract number in a Go comment", "internal/x/y.go", "package x\n\n// Admit follows C2's token rule.\nfunc Admit() {}\n", KindContractNumber},
		{"anchor of the shared set", "docs/a.md", "See the client rules (#ct2-client).\n", KindForeignAnchor},
		{"issue number", "docs/a.md", "Fixed for issue 42.\n", KindIssue},
		{"issue shorthand in Go", "internal/x/y.go", "package x\n\n// See #118 for why.\nvar V = 1\n", KindIssue},
		{"an item of a list kept elsewhere", "docs/a.md", "That is acceptance 3, proven per service.\n", KindNumberedItem},
		{"shared path", "README.md", "Run `../shared/perf/run-ceiling.sh` first.\n", KindOutsidePath},
		{"the shared contract set", "docs/a.md", "As the shared contract set says.\n", KindOutsidePath},
		{"the shared bench", "internal/x/y.go", "package x\n\n// Off, as the shared bench does.\nvar V = 1\n", KindOutsidePath},
		{"the specification", "docs/a.md", "Where the specification is silent, we chose.\n", KindSpecification},
		{"the spec, in Go", "internal/x/y.go", "package x\n\n// Invariant 6 of the spec.\nvar V = 1\n", KindSpecification},
		{"link to a missing page", "README.md", "See [adopting](docs/adopting.md).\n", KindBrokenLink},
		{"link to a missing section", "docs/operations/b.md", "See [roles](../contracts/README.md#who-may-do-whom).\n", KindMissingAnchor},
		{"link leaving the repository", "docs/a.md", "See [the rules](../../rules/fence.md).\n", KindOutsidePath},
		{"link to a missing section of the same page", "docs/a.md", "# A\n\nSee [below](#later).\n", KindMissingAnchor},
		{"Go comment naming a missing page", "internal/x/y.go", "package x\n\n// The rule is in docs/contracts/fence.md.\nvar V = 1\n", KindMissingPath},
		{"Go comment naming a missing file", "internal/x/y.go", "package x\n\n// Mirrors internal/x/gone.go.\nvar V = 1\n", KindMissingPath},
		{"Go string naming a missing page", "internal/x/y.go", "package x\n\nconst Help = \"read docs/howto.md\"\n", KindMissingPath},
		{"prose naming a missing SQL file", "docs/a.md", "In `internal/paydb/migrations/00099_gone.sql`.\n", KindMissingPath},
		{"a served document naming a missing page", "api/x.json", `{"description": "see docs/contracts/gone.md"}`, KindMissingPath},
		{"Go comment naming a missing section", "internal/x/y.go", "package x\n\n// docs/contracts/README.md#roles says who.\nvar V = 1\n", KindMissingAnchor},

		{"a section named by a title the page lacks", "internal/x/y.go", "package x\n\n// See docs/contracts/README.md, \"Deciding an exception\".\nvar V = 1\n", KindMissingSection},
		{"a section of a linked page named by a title it lacks", "docs/operations/b.md", "See [roles](../contracts/README.md), \"Roles\".\n", KindMissingSection},
		{"a migration naming a missing section", "internal/x/0001.sql", "-- see docs/contracts/README.md, \"Deciding\"\n", KindMissingSection},
		{"sections that exist", "internal/x/y.go", "package x\n\n// docs/contracts/README.md, \"Who may do what\"; docs/contracts/README.md, \"lock-server certs\".\nvar V = 1\n", ""},
		{"Unicode's C1 controls", "docs/a.md", "No C0 or C1 control characters (U+0080–U+009F).\n", ""},
		{"C1 controls in a Go comment", "internal/x/y.go", "package x\n\n// other C0 controls, DEL, the C1 controls\nvar V = 1\n", ""},
		{"C3 in a Go string", "internal/x/y.go", "package x\n\nconst Ref = \"RS-C3\"\n", ""},
		{"a percent-encoded byte", "docs/a.md", "The name `%C3%A4` is refused.\n", ""},
		{"OpenAPI's specification", "internal/x/y.go", "package x\n\n// Each document is an OpenAPI 3.1 document by the specification's own schema.\nvar V = 1\n", ""},
		{"links that resolve", "docs/operations/b.md", "[a](a.md), [c](../contracts/README.md#who-may-do-what), [d](../contracts/README.md#lock-server-certs--a-throwaway-authority-for-demos), [n](../contracts/README.md#notes-1), [w](https://example.com/x.md)\n", ""},
		{"a directory link", "README.md", "[ops](docs/operations/)\n", ""},
		{"paths that exist", "internal/x/y.go", "package x\n\n// See docs/contracts/README.md and internal/x/x.go.\nvar V = 1\n", ""},
		{"a link in inline code", "docs/a.md", "Write `[x](nowhere.md)` to link.\n", ""},
		{"a link in a code block", "docs/a.md", "```md\n[x](nowhere.md)\n```\n", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fsys := fstest.MapFS{}
			for k, v := range base {
				fsys[k] = v
			}
			fsys[tc.file] = &fstest.MapFile{Data: []byte(tc.text)}
			r, err := Load(fsys)
			if err != nil {
				t.Fatal(err)
			}
			got, err := r.Check()
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for _, f := range got {
				kinds = append(kinds, f.Kind)
				if f.File != tc.file {
					t.Errorf("a finding outside the planted file: %s", f)
				}
			}
			switch {
			case tc.want == "" && len(got) > 0:
				t.Errorf("want no finding, got %v", got)
			case tc.want != "" && !slices.Contains(kinds, tc.want):
				t.Errorf("want a %s finding, got %v", tc.want, got)
			}
		})
	}
}

func TestSlug(t *testing.T) {
	t.Parallel()
	for h, want := range map[string]string{
		"Who may do what": "who-may-do-what",
		"`lock-server certs` — a throwaway authority, for demos, compose and tests": "lock-server-certs--a-throwaway-authority-for-demos-compose-and-tests",
		"Group admission (`RAIL_PROXY_MAX_GROUP`)":                                  "group-admission-rail_proxy_max_group",
		"The admission, in four steps":                                              "the-admission-in-four-steps",
	} {
		if got := Slug(h); got != want {
			t.Errorf("Slug(%q) = %q, want %q", h, got, want)
		}
	}
}

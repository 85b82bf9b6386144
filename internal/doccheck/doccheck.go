package doccheck

import (
	"bufio"
	"fmt"
	"go/scanner"
	"go/token"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strings"
	"unicode"
)

// The kinds of Finding.
const (
	KindContractNumber = "contract-number" // a contract cited by its number (C and 1 to 10), from a set the repository does not hold
	KindForeignAnchor  = "foreign-anchor"  // a section anchor of such a contract ("#ct" and a digit)
	KindIssue          = "issue-number"    // an issue or pull request by number
	KindNumberedItem   = "numbered-item"   // an item of a list the repository does not hold ("acceptance" and a number)
	KindOutsidePath    = "outside-path"    // a path above the repository's root (the shared tree beside it), or a link leaving it
	KindSpecification  = "specification"   // a specification cited as if the repository held it
	KindBrokenLink     = "broken-link"     // a Markdown link whose file does not exist
	KindMissingAnchor  = "missing-anchor"  // a link to a heading its page does not have
	KindMissingPath    = "missing-path"    // a repository path named in prose, a comment or a served document that no file has
	KindMissingSection = "missing-section" // a page's section named by its title (page.md, "Title") that the page does not have
)

// A Finding is one reference a reader of the repository cannot follow.
type Finding struct {
	File string // slash-separated, relative to the repository's root
	Line int
	Kind string
	Text string // the reference as written
}

func (f Finding) String() string {
	return fmt.Sprintf("%s:%d: %s: %s", f.File, f.Line, f.Kind, f.Text)
}

// skipDirs are never scanned: not the project's text (.git, vendored code) or
// fixtures whose bytes are test inputs (testdata). Their files still exist for
// links.
var skipDirs = []string{".git", "vendor", "node_modules", "testdata"}

// Repo is a repository as the checker sees it: the paths it holds and the
// anchors of its Markdown pages.
type Repo struct {
	fsys    fs.FS
	paths   map[string]bool            // every file and directory, slash paths; "." is the root
	anchors map[string]map[string]bool // Markdown page → its anchors, read on first use
	titles  map[string][]string        // Markdown page → its headings' text, lower case, without backticks
	// repoPath is a path into the repository as prose writes it: one of its
	// top-level directories, then a file with one of the project's extensions.
	repoPath *regexp.Regexp
}

// Load reads the tree of fsys (a repository's root, as os.DirFS gives it).
func Load(fsys fs.FS) (*Repo, error) {
	r := &Repo{fsys: fsys, paths: map[string]bool{}, anchors: map[string]map[string]bool{}, titles: map[string][]string{}}
	var top []string // the top-level directories, in walk (lexical) order
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != "." && d.Name() == ".git" {
			return fs.SkipDir
		}
		r.paths[p] = true
		if d.IsDir() && p != "." && !strings.Contains(p, "/") && !strings.HasPrefix(p, ".") {
			top = append(top, regexp.QuoteMeta(p))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("doccheck: walk the repository: %w", err)
	}
	r.repoPath = regexp.MustCompile(`(^|[^\w/.-])((?:` + strings.Join(top, "|") + `)/[\w./-]*\.(?:md|go|sql|yaml|yml|json|sh))(#[\w-]+)?`)
	return r, nil
}

// Check scans every Markdown and Go file (and the JSON and YAML documents, for the
// pages they name) and returns what it found, in file order.
func (r *Repo) Check() ([]Finding, error) {
	var files []string
	for p := range r.paths {
		if skipped(p) {
			continue
		}
		switch path.Ext(p) {
		case ".md", ".go", ".json", ".yaml", ".yml", ".sql":
			files = append(files, p)
		}
	}
	slices.Sort(files)
	var out []Finding
	for _, p := range files {
		b, err := fs.ReadFile(r.fsys, p)
		if err != nil {
			return nil, fmt.Errorf("doccheck: read %s: %w", p, err)
		}
		switch path.Ext(p) {
		case ".md":
			out = append(out, r.CheckMarkdown(p, string(b))...)
		case ".go":
			out = append(out, r.CheckGo(p, b)...)
		default:
			out = append(out, r.checkDocPaths(p, 1, string(b))...)
			out = append(out, r.checkSections(p, 1, string(b))...)
		}
	}
	return out, nil
}

func skipped(p string) bool {
	for _, part := range strings.Split(p, "/") {
		if slices.Contains(skipDirs, part) {
			return true
		}
	}
	return false
}

var (
	// contractNumber is C and a number from 1 to 10 as a word of its own; a rail
	// reference such as RS-C3 and a percent-encoded byte such as %C3 are not.
	contractNumber = regexp.MustCompile(`(^|[^\w%+.-])C(10|[1-9])\b`)
	// unicodeControls is the context in which C0 and C1 name Unicode's control sets.
	unicodeControls = regexp.MustCompile(`(?i)control|U\+00[0-9A-F]{2}`)
	foreignAnchor   = regexp.MustCompile(`#ct\d[\w-]*`)
	issueNumber     = regexp.MustCompile(`(?i)\b(issue|pull request|PR)s?\s+#?\d+\b|(^|[\s(\[])#\d+\b`)
	// numberedItem is an item of a list kept elsewhere ("acceptance" and a number).
	numberedItem  = regexp.MustCompile(`(?i)\b(acceptance|requirement|criterion)( item)? #?\d+\b`)
	outsidePath   = regexp.MustCompile(`(\.\./)+shared\b[\w./-]*|\bshared/(spec|perf|ha|seed|hooks|iso20022)\b[\w./-]*|(?i)\bthe shared (bench|harness|set)\b|(?i)\bshared contract`)
	specification = regexp.MustCompile(`(?i)\bthe spec(ification)?('s|s)?\b`)
	// namedStandard, just before the word, says which public specification is meant.
	namedStandard = regexp.MustCompile(`(OpenAPI|ISO|RFC|SPIFFE|JWT|JSON|PostgreSQL|X\.509|camt|pain|W3C|HTTP)(?:[^.;]|\.\d){0,40}$`)
	// docPath is the subset a Go string or a served document may name.
	docPath = regexp.MustCompile(`(^|[^\w/.-])(docs/[\w./-]*\.md)(#[\w-]+)?`)
)

// checkText looks in one line of prose or one comment for references to things
// the repository does not hold. line is where text starts; text may span lines.
func checkText(file string, line int, text string) []Finding {
	var out []Finding
	add := func(kind string, at int, s string) {
		out = append(out, Finding{File: file, Line: line + strings.Count(text[:at], "\n"), Kind: kind, Text: s})
	}
	for _, m := range contractNumber.FindAllStringSubmatchIndex(text, -1) {
		start, end := m[2*1+1], m[1]
		lo, hi := max(0, start-60), min(len(text), end+60)
		if unicodeControls.MatchString(text[lo:hi]) {
			continue // "the C1 controls", "C0 and C1 (U+0080–U+009F)": Unicode's names
		}
		add(KindContractNumber, start, strings.TrimSpace(text[start:end]))
	}
	for _, m := range foreignAnchor.FindAllStringIndex(text, -1) {
		add(KindForeignAnchor, m[0], text[m[0]:m[1]])
	}
	for _, m := range issueNumber.FindAllStringIndex(text, -1) {
		add(KindIssue, m[0], strings.TrimSpace(text[m[0]:m[1]]))
	}
	for _, m := range numberedItem.FindAllStringIndex(text, -1) {
		add(KindNumberedItem, m[0], text[m[0]:m[1]])
	}
	for _, m := range outsidePath.FindAllStringIndex(text, -1) {
		add(KindOutsidePath, m[0], text[m[0]:m[1]])
	}
	for _, m := range specification.FindAllStringIndex(text, -1) {
		if namedStandard.MatchString(text[max(0, m[0]-80):m[0]]) {
			continue // an OpenAPI 3.1 document, checked by its own specification's schema
		}
		add(KindSpecification, m[0], text[m[0]:m[1]])
	}
	return out
}

// checkPaths reports the repository paths text names that no file has, and the
// sections of Markdown pages it names that the page does not have.
func (r *Repo) checkPaths(re *regexp.Regexp, file string, line int, text string) []Finding {
	var out []Finding
	for _, m := range re.FindAllStringSubmatchIndex(text, -1) {
		p := strings.TrimRight(text[m[4]:m[5]], ".")
		frag := ""
		if m[6] >= 0 {
			frag = text[m[6]+1 : m[7]]
		}
		at := line + strings.Count(text[:m[4]], "\n")
		if !r.paths[p] {
			out = append(out, Finding{File: file, Line: at, Kind: KindMissingPath, Text: p})
			continue
		}
		if frag != "" && path.Ext(p) == ".md" && !r.anchorsOf(p)[frag] {
			out = append(out, Finding{File: file, Line: at, Kind: KindMissingAnchor, Text: p + "#" + frag})
		}
	}
	return out
}

func (r *Repo) checkDocPaths(file string, line int, text string) []Finding {
	return r.checkPaths(docPath, file, line, text)
}

// CheckGo checks a Go file's comments (every kind of reference) and, outside
// tests, its string literals (the documentation pages they name: a program's
// output that points a reader to a page; a test's strings are its fixtures).
func (r *Repo) CheckGo(file string, src []byte) []Finding {
	fset := token.NewFileSet()
	tf := fset.AddFile(file, -1, len(src))
	var s scanner.Scanner
	s.Init(tf, src, func(token.Position, string) {}, scanner.ScanComments)
	var out []Finding
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			break
		}
		line := fset.Position(pos).Line
		switch tok {
		case token.COMMENT:
			out = append(out, checkText(file, line, lit)...)
			out = append(out, r.checkPaths(r.repoPath, file, line, lit)...)
			out = append(out, r.checkSections(file, line, lit)...)
		case token.STRING:
			if !strings.HasSuffix(file, "_test.go") {
				out = append(out, r.checkDocPaths(file, line, lit)...)
			}
		}
	}
	return out
}

var (
	fence       = regexp.MustCompile("^\\s*(```|~~~)")
	codeSpan    = regexp.MustCompile("`[^`]*`")
	inlineLink  = regexp.MustCompile(`\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	refLinkDef  = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(\s|$)`)
	heading     = regexp.MustCompile(`^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$`)
	htmlAnchor  = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	hasScheme   = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	slugDropped = regexp.MustCompile(`[^\p{L}\p{N}\p{M} _-]`)
	boldLead    = regexp.MustCompile(`^\s*(?:[-*]\s+|\d+\.\s+)?\*\*([^*]+)\*\*`)
)

// CheckMarkdown checks a Markdown page: its prose and code for references (code
// blocks too: a report excerpt or a command is read as much as a sentence), and
// its links outside code for files and sections that exist.
func (r *Repo) CheckMarkdown(file, text string) []Finding {
	var out []Finding
	inFence := false
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		out = append(out, checkText(file, n, line)...)
		if fence.MatchString(line) {
			inFence = !inFence
			continue
		}
		if inFence {
			out = append(out, r.checkPaths(r.repoPath, file, n, line)...)
			continue
		}
		// A link's target is judged as a link below, not again as a path.
		out = append(out, r.checkPaths(r.repoPath, file, n, inlineLink.ReplaceAllString(line, "]()"))...)
		out = append(out, r.checkSections(file, n, line)...)
		prose := codeSpan.ReplaceAllString(line, "``")
		var targets []string
		for _, m := range inlineLink.FindAllStringSubmatch(prose, -1) {
			targets = append(targets, m[1])
		}
		if m := refLinkDef.FindStringSubmatch(prose); m != nil {
			targets = append(targets, m[1])
		}
		for _, t := range targets {
			if f, ok := r.checkLink(file, t); !ok {
				f.File, f.Line = file, n
				out = append(out, f)
			}
		}
	}
	return out
}

// checkLink resolves one link target of page file.
func (r *Repo) checkLink(file, target string) (Finding, bool) {
	if hasScheme.MatchString(target) {
		return Finding{}, true // the web, mail: not the repository's to check
	}
	p, frag, _ := strings.Cut(target, "#")
	switch {
	case p == "":
		p = file
	case strings.HasPrefix(p, "/"):
		p = path.Clean(strings.TrimPrefix(p, "/"))
	default:
		p = path.Join(path.Dir(file), p)
	}
	if p == ".." || strings.HasPrefix(p, "../") {
		return Finding{Kind: KindOutsidePath, Text: target}, false
	}
	if !r.paths[p] {
		return Finding{Kind: KindBrokenLink, Text: target}, false
	}
	if frag != "" && path.Ext(p) == ".md" && !r.anchorsOf(p)[frag] {
		return Finding{Kind: KindMissingAnchor, Text: target}, false
	}
	return Finding{}, true
}

// anchorsOf gives the anchors of a Markdown page as GitHub renders them: each
// heading's slug (lower case, punctuation dropped, each space a hyphen; a repeated
// slug gets -1, -2, …) and every <a name> or <a id>.
func (r *Repo) anchorsOf(p string) map[string]bool {
	if a, ok := r.anchors[p]; ok {
		return a
	}
	a := map[string]bool{}
	r.anchors[p] = a
	b, err := fs.ReadFile(r.fsys, p)
	if err != nil {
		return a // the path exists but is not readable as a page: no anchors
	}
	inFence := false
	for _, line := range strings.Split(string(b), "\n") {
		if fence.MatchString(line) {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			a[m[1]] = true
		}
		if m := boldLead.FindStringSubmatch(line); m != nil {
			// A named paragraph ("- **Storable text.** …") is cited by its name too.
			r.titles[p] = append(r.titles[p], strings.ToLower(strings.ReplaceAll(m[1], "`", "")))
		}
		m := heading.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		r.titles[p] = append(r.titles[p], strings.ToLower(strings.ReplaceAll(m[1], "`", "")))
		s := Slug(m[1])
		if !a[s] {
			a[s] = true
			continue
		}
		for i := 1; ; i++ {
			if d := fmt.Sprintf("%s-%d", s, i); !a[d] {
				a[d] = true
				break
			}
		}
	}
	return a
}

// Slug is the anchor GitHub gives a heading's text.
func Slug(h string) string {
	h = strings.Map(func(r rune) rune {
		if unicode.IsUpper(r) {
			return unicode.ToLower(r)
		}
		return r
	}, h)
	h = slugDropped.ReplaceAllString(h, "")
	return strings.ReplaceAll(h, " ", "-")
}

// sectionRef is a page's section named by its title, as prose and comments cite
// one: `rail-proxy.md, "Group admission"` or `([books.md](books.md), "When a check
// refuses")`.
var sectionRef = regexp.MustCompile(`([\w./-]+\.md)\)?,?\s"([^"\n]{3,80})"`)

// checkSections reports each section named by its title that its page does not
// have: a heading, or a paragraph's bold name, must begin with the title (case
// and backticks aside). A page
// that does not exist is left to the path and link checks.
func (r *Repo) checkSections(file string, line int, text string) []Finding {
	var out []Finding
	for _, m := range sectionRef.FindAllStringSubmatchIndex(text, -1) {
		ref, title := text[m[2]:m[3]], text[m[4]:m[5]]
		p := path.Clean(ref)
		if !r.paths[p] && path.Ext(file) == ".md" {
			p = path.Join(path.Dir(file), ref)
		}
		if !r.paths[p] {
			continue
		}
		r.anchorsOf(p) // reads the page's headings
		want := strings.ToLower(strings.ReplaceAll(title, "`", ""))
		if !slices.ContainsFunc(r.titles[p], func(h string) bool { return strings.HasPrefix(h, want) }) {
			out = append(out, Finding{File: file, Line: line + strings.Count(text[:m[0]], "\n"), Kind: KindMissingSection, Text: ref + `, "` + title + `"`})
		}
	}
	return out
}

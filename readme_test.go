package idem_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// snippetSources are the compiled Go files the README's snippets come from:
// the Example functions of every package and the example programs. Each is
// built by the test run, so a snippet found in one of them compiles.
var snippetSources = []string{"example*_test.go", "*/example*_test.go", "examples/*/main.go"}

// snippetDocs are the documents whose Go snippets the tests below check,
// each on its own: a reader pastes from one of them.
var snippetDocs = []string{"README.md", "docs/guide.md"}

// TestReadmeSnippets fails when a Go snippet of a snippetDoc is not, line
// for line (indentation aside), a run of lines of one of the
// snippetSources: an API change that breaks a snippet breaks its source's
// build, and a snippet edited away from its source fails here.
func TestReadmeSnippets(t *testing.T) {
	for _, doc := range snippetDocs {
		t.Run(doc, func(t *testing.T) { checkSnippetSources(t, doc) })
	}
}

func checkSnippetSources(t *testing.T, doc string) {
	readme, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	snippets := fencedBlocks(string(readme), "go")
	if len(snippets) == 0 {
		t.Fatalf("%s has no Go snippet", doc)
	}
	sources := map[string][]string{}
	for _, pattern := range snippetSources {
		files, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			sources[f] = trimLines(string(b))
		}
	}
	if len(sources) < 5 {
		t.Fatalf("found %d source files for the snippets; run the test from the repository's root", len(sources))
	}
	for _, s := range snippets {
		want := trimLines(s.text)
		found := ""
		for f, lines := range sources {
			if containsRun(lines, want) {
				found = f
				break
			}
		}
		if found == "" {
			t.Errorf("%s line %d: this snippet is in no example (%s); copy it from one that compiles:\n%s",
				doc, s.line, strings.Join(snippetSources, ", "), s.text)
		}
	}
}

// TestFencedBlocks checks the README parser on a README-like text, so that
// TestReadmeSnippets cannot pass by finding nothing to compare.
func TestFencedBlocks(t *testing.T) {
	text := "# t\n\n```go\na := 1\n\n\tb := 2\n```\n\n```sh\nls\n```\n```go\nc()\n```\n"
	got := fencedBlocks(text, "go")
	if len(got) != 2 || got[0].text != "a := 1\n\n\tb := 2" || got[0].line != 4 || got[1].text != "c()" || got[1].line != 13 {
		t.Fatalf("fencedBlocks = %+v", got)
	}
	lines := trimLines("x\n\ty := 1\n\tz()\n")
	if !containsRun(lines, trimLines("y := 1\n  z()")) || containsRun(lines, trimLines("y := 1\nx")) {
		t.Fatal("containsRun does not match runs of trimmed lines")
	}
}

type block struct {
	text string
	line int // of the block's first line of code, from 1
}

var fence = regexp.MustCompile("^```([a-z]*)\\s*$")

// fencedBlocks returns the code blocks of a markdown text fenced with
// ```lang.
func fencedBlocks(text, lang string) []block {
	var blocks []block
	var cur []string
	in, keep, start := false, false, 0
	for i, l := range strings.Split(text, "\n") {
		m := fence.FindStringSubmatch(l)
		switch {
		case m != nil && !in:
			in, keep, start, cur = true, m[1] == lang, i+2, nil
		case m != nil && in && m[1] == "":
			if keep {
				blocks = append(blocks, block{text: strings.Join(cur, "\n"), line: start})
			}
			in = false
		case in:
			cur = append(cur, l)
		}
	}
	return blocks
}

func trimLines(s string) []string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimSpace(l)
	}
	return lines
}

// containsRun reports whether want appears in lines as consecutive lines.
func containsRun(lines, want []string) bool {
	for i := 0; i+len(want) <= len(lines); i++ {
		match := true
		for j, w := range want {
			if lines[i+j] != w {
				match = false
				break
			}
		}
		if match {
			return true
		}
	}
	return false
}

// readmeGiven are the names each snippetDoc gives every snippet in words,
// with the words that give them (spaces and line breaks aside).
var readmeGiven = map[string]string{
	"ctx":  "`ctx` is a `context.Context`",
	"pool": "`pool` a `*pgxpool.Pool`",
}

// TestReadmeSnippetsStandAlone fails when a Go snippet of a snippetDoc would
// not compile where a reader pastes it: it uses a name that neither it nor
// a snippet before it declares at its top level (nor the README's text
// gives, readmeGiven), a package whose import the README does not show; it
// declares a variable it never uses; it returns a value outside a function;
// or it has a continue or break outside a loop. The imports shown must all
// be used by some snippet.
func TestReadmeSnippetsStandAlone(t *testing.T) {
	for _, doc := range snippetDocs {
		t.Run(doc, func(t *testing.T) { checkSnippetsStandAlone(t, doc) })
	}
}

func checkSnippetsStandAlone(t *testing.T, doc string) {
	readme, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	words := strings.Join(strings.Fields(string(readme)), " ")
	for name, sentence := range readmeGiven {
		if !strings.Contains(words, sentence) {
			t.Errorf("%s no longer says %q, which gives the snippets %s", doc, sentence, name)
		}
	}
	snippets := fencedBlocks(string(readme), "go")
	global := map[string]bool{"_": true}
	for name := range readmeGiven {
		global[name] = true
	}
	files := make([]*ast.File, len(snippets))
	imported := map[string]int{} // package name: the line of the snippet that imports it
	for i, s := range snippets {
		f, err := parseSnippet(s.text)
		if err != nil {
			t.Fatalf("%s line %d: the snippet does not parse as Go: %v", doc, s.line, err)
		}
		files[i] = f
		// Imports count wherever they are shown.
		for _, imp := range f.Imports {
			global[importName(imp)] = true
			imported[importName(imp)] = s.line
		}
	}
	used := map[string]bool{}
	for i, f := range files {
		line := snippets[i].line
		for name := range topLevel(f) {
			global[name] = true
		}
		local := declarations(f)
		uses := identUses(f)
		for name := range uses {
			used[name] = true
			if !global[name] && !local[name] && types.Universe.Lookup(name) == nil && name != "p" {
				t.Errorf("%s line %d: the snippet uses %s, which no snippet up to it declares", doc, line, name)
			}
		}
		for name := range definedVars(f) {
			if uses[name] < 2 { // its declaration is its only mention
				t.Errorf("%s line %d: the snippet declares %s and never uses it", doc, line, name)
			}
		}
		for _, b := range strayBranches(f) {
			t.Errorf("%s line %d: the snippet has a %s outside a loop", doc, line, b)
		}
		if returnsOutsideFunc(f) {
			t.Errorf("%s line %d: the snippet returns a value outside a function: show the function", doc, line)
		}
	}
	for name, line := range imported {
		if !used[name] {
			t.Errorf("%s line %d: the import of %s is used by no snippet", doc, line, name)
		}
	}
}

// parseSnippet parses a snippet as a file (declarations) or, failing that,
// as the body of a function _ (statements).
func parseSnippet(text string) (*ast.File, error) {
	if f, err := parser.ParseFile(token.NewFileSet(), "", "package p\n"+text, parser.SkipObjectResolution); err == nil {
		return f, nil
	}
	return parser.ParseFile(token.NewFileSet(), "", "package p\nfunc _() {\n"+text+"\n}", parser.SkipObjectResolution)
}

// wrapped is the function parseSnippet put a statement snippet in, or nil.
func wrapped(f *ast.File) *ast.FuncDecl {
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == "_" {
			return fd
		}
	}
	return nil
}

// importName is the name an import declares: its alias, or the last element
// of its path that is not a major version.
func importName(imp *ast.ImportSpec) string {
	if imp.Name != nil {
		return imp.Name.Name
	}
	parts := strings.Split(strings.Trim(imp.Path.Value, `"`), "/")
	last := parts[len(parts)-1]
	if len(parts) > 1 && regexp.MustCompile(`^v[0-9]+$`).MatchString(last) {
		last = parts[len(parts)-2]
	}
	return last
}

// topLevel are the names a snippet leaves to the snippets after it: its
// functions, types, variables and constants, and for a snippet of
// statements the variables they declare outside any block.
func topLevel(f *ast.File) map[string]bool {
	names := map[string]bool{}
	for _, d := range f.Decls {
		switch x := d.(type) {
		case *ast.GenDecl:
			for _, spec := range x.Specs {
				switch sp := spec.(type) {
				case *ast.ValueSpec:
					for _, id := range sp.Names {
						names[id.Name] = true
					}
				case *ast.TypeSpec:
					names[sp.Name.Name] = true
				}
			}
		case *ast.FuncDecl:
			if x.Name.Name != "_" {
				names[x.Name.Name] = true
				continue
			}
			for _, st := range x.Body.List {
				if as, ok := st.(*ast.AssignStmt); ok && as.Tok == token.DEFINE {
					for _, e := range as.Lhs {
						if id, ok := e.(*ast.Ident); ok {
							names[id.Name] = true
						}
					}
				}
			}
		}
	}
	return names
}

// declarations are the names f declares anywhere: variables, constants,
// types, functions and their parameters.
func declarations(f *ast.File) map[string]bool {
	names := definedVars(f)
	addFields := func(fl *ast.FieldList) {
		if fl == nil {
			return
		}
		for _, field := range fl.List {
			for _, n := range field.Names {
				names[n.Name] = true
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.TypeSpec:
			names[x.Name.Name] = true
		case *ast.FuncDecl:
			names[x.Name.Name] = true
			addFields(x.Recv)
		case *ast.FuncType:
			addFields(x.Params)
			addFields(x.Results)
		}
		return true
	})
	return names
}

// definedVars are the variables f declares with := or var, which Go
// requires to be used.
func definedVars(f *ast.File) map[string]bool {
	names := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.AssignStmt:
			if x.Tok == token.DEFINE {
				for _, e := range x.Lhs {
					if id, ok := e.(*ast.Ident); ok && id.Name != "_" {
						names[id.Name] = true
					}
				}
			}
		case *ast.RangeStmt:
			if x.Tok == token.DEFINE {
				for _, e := range []ast.Expr{x.Key, x.Value} {
					if id, ok := e.(*ast.Ident); ok && id.Name != "_" {
						names[id.Name] = true
					}
				}
			}
		case *ast.ValueSpec:
			for _, id := range x.Names {
				if id.Name != "_" {
					names[id.Name] = true
				}
			}
		}
		return true
	})
	return names
}

// identUses counts how often each name stands in f where a variable,
// function, type or package could: not as a field or method after a dot,
// a field name in a composite literal or a declaration of a parameter or
// field. A variable's own declaration counts as one.
func identUses(f *ast.File) map[string]int {
	uses := map[string]int{}
	var visit func(n ast.Node) bool
	visit = func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.SelectorExpr:
			ast.Inspect(x.X, visit)
			return false
		case *ast.KeyValueExpr:
			if _, ok := x.Key.(*ast.Ident); !ok { // an identifier key names a field
				ast.Inspect(x.Key, visit)
			}
			ast.Inspect(x.Value, visit)
			return false
		case *ast.Field:
			ast.Inspect(x.Type, visit) // the names are declared, not used
			return false
		case *ast.BranchStmt, *ast.ImportSpec:
			return false
		case *ast.TypeSpec:
			ast.Inspect(x.Type, visit)
			return false
		case *ast.FuncDecl:
			ast.Inspect(x.Type, visit)
			if x.Body != nil {
				ast.Inspect(x.Body, visit)
			}
			return false
		case *ast.Ident:
			uses[x.Name]++
		}
		return true
	}
	for _, d := range f.Decls {
		ast.Inspect(d, visit)
	}
	return uses
}

// returnsOutsideFunc reports whether a snippet of statements returns a
// value from the function it does not show.
func returnsOutsideFunc(f *ast.File) bool {
	fd := wrapped(f)
	if fd == nil {
		return false
	}
	found := false
	ast.Inspect(fd.Body, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.FuncLit:
			return false // its returns are its own
		case *ast.ReturnStmt:
			found = found || len(x.Results) > 0
		}
		return true
	})
	return found
}

// strayBranches lists the continue and break statements of f that no loop,
// switch or select encloses.
func strayBranches(f *ast.File) []string {
	var stray []string
	var walk func(n ast.Node, inLoop, inSwitch bool)
	walk = func(n ast.Node, inLoop, inSwitch bool) {
		ast.Inspect(n, func(c ast.Node) bool {
			if c == n {
				return true
			}
			switch x := c.(type) {
			case *ast.ForStmt, *ast.RangeStmt:
				walk(x, true, inSwitch)
				return false
			case *ast.SwitchStmt, *ast.TypeSwitchStmt, *ast.SelectStmt:
				walk(x, inLoop, true)
				return false
			case *ast.FuncLit:
				walk(x, false, false)
				return false
			case *ast.BranchStmt:
				if x.Label == nil && ((x.Tok == token.CONTINUE && !inLoop) || (x.Tok == token.BREAK && !inLoop && !inSwitch)) {
					stray = append(stray, x.Tok.String())
				}
			}
			return true
		})
	}
	walk(f, false, false)
	return stray
}

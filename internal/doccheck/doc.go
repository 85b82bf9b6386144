// Package doccheck keeps the repository's documentation self-contained: every
// reference a reader meets in its Markdown, its Go comments and the documents it
// serves must lead somewhere inside the repository.
//
// Check reports what a reader of a clone could not follow: a contract cited by a
// number or by an anchor of a document the repository does not hold, an issue
// number, a path outside the repository, a specification cited as if the
// repository held it, a Markdown link whose file or section does not
// exist, and a repository path named in prose or a comment that no file has. The
// package's test runs it over the whole repository.
package doccheck

package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"lock.dev/internal/dbconn"
	"lock.dev/internal/paydb"
	"lock.dev/internal/serve"
	"lock.dev/internal/service"
)

// ExceptionsCommand is the subcommand `reconciler exceptions`.
const ExceptionsCommand = "exceptions"

// ExceptionsTimeout bounds a whole `reconciler exceptions` run: connecting, the
// schema check, and its reads or its one write.
const ExceptionsTimeout = 30 * time.Second

// DefaultListLimit is how many exceptions `list` shows unless --limit says.
const DefaultListLimit = 200

const exceptionsName = ServiceName + " " + ExceptionsCommand

const exceptionsUsage = `reconciler exceptions list [--all] [--kind KIND] [--limit N] [--json]
reconciler exceptions show ID [--json]
reconciler exceptions resolve ID --decision DECISION --by WHO --note TEXT [--json]

An operator's view of the reconciliation exceptions in paydb
(docs/operations/reconciliation-exceptions.md):

  list      the open exceptions (no decision recorded), oldest first; --all adds
            the decided ones with their decision
  show      one exception with its context: the payout as it is now, its history
            and settlement, its attempts at the gate, the statement lines that name
            it, the statement file versions it names, and its decision if any
  resolve   record a decision beside the exception: who decided (--by), what
            (--decision) and why (--note), all required; paydb records the login
            and its own clock. An exception is decided once: a second resolve is
            refused and nothing is written.

Decisions:
  accepted-as-is        investigated: the books and the rail stand as they are
  corrected-in-ledger   the books were corrected by a ledger posting outside lock.dev
  refunded              the money paid in error came back (recalled, returned)
  written-off           the money paid in error will not come back; the loss is booked

Deciding an exception never settles or unsettles a payout, and books nothing:
an exception never settles or unsettles anything. The payout stays in the state
it is in; what the decision says was done was done elsewhere. This command only
records that a person looked, what they concluded, and when.

Connect with the operators' paydb login (PAYDB_ROLE_OPERATOR), which may read
the exceptions and their context and insert a decision, nothing else.
Exit status: 0 done; 2 a bad argument, an unknown exception id, or an exception
already decided (nothing written); 1 anything else (paydb unreachable, …).

`

// exceptionsArgs is one parsed `reconciler exceptions` command line.
type exceptionsArgs struct {
	verb     string // list, show, resolve
	paydbURL string
	json     bool
	list     ListOptions
	id       int64
	res      Resolution
}

// Exceptions runs `reconciler exceptions` with args (what follows
// "exceptions"), the environment getenv, and writes its answer to stdout; it
// returns the process's exit status (serve.ExitCode's: 0, 2 for a refusal, 1
// for a failure), with one line on stderr for anything but 0.
func Exceptions(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	a, err := parseExceptions(args, getenv, stdout)
	if err == nil {
		err = runExceptions(ctx, a, stdout)
	}
	return serve.ExitCode(refusal(err), stderr)
}

// refusal turns what the operator asked for wrongly — an unknown id, a second
// decision, a resolution refused — into a *serve.UsageError: exit 2, one line,
// nothing written. Anything else stays an error: exit 1.
func refusal(err error) error {
	var decided *DecidedError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &decided):
		return &serve.UsageError{Msg: exceptionsName + " resolve: " + decided.Error()}
	case errors.Is(err, ErrNoSuchException):
		return &serve.UsageError{Msg: exceptionsName + ": " + err.Error() + " (`reconciler exceptions list --all` lists them)"}
	case errors.Is(err, ErrInvalidResolution):
		return &serve.UsageError{Msg: exceptionsName + " resolve: " + strings.TrimPrefix(err.Error(), ErrInvalidResolution.Error()+": ") + "; nothing written"}
	}
	return err
}

func parseExceptions(args []string, getenv func(string) string, stdout io.Writer) (exceptionsArgs, error) {
	var a exceptionsArgs
	usage := func(msg string, v ...any) error {
		return &serve.UsageError{Msg: exceptionsName + ": " + fmt.Sprintf(msg, v...)}
	}
	verb, rest := serve.SplitCommand(args, "")
	s := serve.NewSettings(exceptionsName, getenv)
	s.String(&a.paydbURL, "PAYDB_URL", "", "paydb connection URL, with the operators' login; empty uses the libpq PG* environment")
	fs := s.FlagSet()
	fs.BoolVar(&a.json, "json", false, "list, show, resolve: answer in JSON instead of a table")
	fs.BoolVar(&a.list.All, "all", false, "list: the decided exceptions too")
	fs.StringVar(&a.list.Kind, "kind", "", "list: only this kind (e.g. PRESENTED_TWICE)")
	fs.IntVar(&a.list.Limit, "limit", DefaultListLimit, "list: at most this many")
	fs.StringVar(&a.res.Decision, "decision", "", "resolve: "+strings.Join(Decisions(), ", "))
	fs.StringVar(&a.res.DecidedBy, "by", "", "resolve: who decided — the operator's name or identity (required)")
	fs.StringVar(&a.res.Note, "note", "", "resolve: why — what was found, what was done (required)")
	writeUsage := func() {
		fmt.Fprint(stdout, exceptionsUsage)
		s.Usage(stdout, exceptionsName+" list|show|resolve [ID] [flags]")
	}
	switch {
	case verb == service.HelpCommand, verb == "" && len(rest) > 0 && slices.Contains([]string{"-h", "-help", "--help"}, rest[0]):
		writeUsage()
		return a, serve.ErrHelp
	case verb == "":
		return a, usage("a command is required: list, show or resolve (`reconciler exceptions help`)")
	}
	switch verb {
	case "list", "show", "resolve":
		a.verb = verb
	default:
		return a, usage("unknown command %q (commands: list, show, resolve)", verb)
	}
	// The id may come before the flags or after them.
	var positional []string
	for {
		extra, err := s.Parse(rest)
		if errors.Is(err, serve.ErrHelp) {
			writeUsage()
			return a, err
		}
		if err != nil {
			return a, err
		}
		if len(extra) == 0 {
			break
		}
		positional = append(positional, extra[0])
		rest = extra[1:]
	}
	switch {
	case a.verb == "list" && len(positional) > 0:
		return a, usage("list: unexpected argument %q", positional[0])
	case a.verb != "list" && len(positional) == 0:
		return a, usage("%s: the exception's id is required", a.verb)
	case a.verb != "list" && len(positional) > 1:
		return a, usage("%s: unexpected argument %q", a.verb, positional[1])
	case a.verb != "list":
		id, err := strconv.ParseInt(positional[0], 10, 64)
		if err != nil || id < 1 {
			return a, usage("%s: %q is not an exception id (a positive integer)", a.verb, positional[0])
		}
		a.id = id
	}
	if a.list.Limit < 1 {
		return a, usage("list: --limit must be at least 1, got %d", a.list.Limit)
	}
	if err := dbconn.CheckURL(a.paydbURL); err != nil {
		return a, serve.Invalid("PAYDB_URL", "cannot be parsed as a PostgreSQL connection string")
	}
	if a.verb == "resolve" {
		// Refused before paydb is asked anything: nothing written.
		res, err := a.res.Check()
		if err != nil {
			return a, err
		}
		a.res = res
	}
	return a, nil
}

func runExceptions(ctx context.Context, a exceptionsArgs, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, ExceptionsTimeout)
	defer cancel()
	pool, err := dbconn.Open(ctx, a.paydbURL, 2)
	if err != nil {
		return fmt.Errorf("paydb: %w", err)
	}
	defer pool.Close()
	if err := paydb.Tree().RequireCurrent(ctx, pool, ServiceName+" migrate"); err != nil {
		return err
	}
	book := NewExceptionBook(pool)
	switch a.verb {
	case "list":
		list, more, err := book.List(ctx, a.list)
		if err != nil {
			return err
		}
		if a.json {
			return writeJSON(out, list)
		}
		return writeList(out, list, more, a.list)
	case "show":
		c, err := book.Show(ctx, a.id)
		if err != nil {
			return err
		}
		if a.json {
			return writeJSON(out, c)
		}
		return writeShow(out, c)
	default:
		d, err := book.Resolve(ctx, a.id, a.res)
		if err != nil {
			return err
		}
		if a.json {
			return writeJSON(out, struct {
				ExceptionID int64 `json:"exceptionId"`
				Decision
			}{a.id, d})
		}
		_, err = fmt.Fprintf(out, "exception %d decided: %s by %s at %s (paydb login %s).\n"+
			"Nothing was settled or unsettled: the payout stays as it is.\n",
			a.id, d.Decision, d.DecidedBy, stamp(d.DecidedAt), d.DecidedLogin)
		return err
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// maxDetail bounds a detail in the list's table; show prints it whole.
const maxDetail = 100

func writeList(w io.Writer, list []Exception, more bool, opts ListOptions) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tKIND\tPAYOUT\tSEQ\tCREATED (UTC)\tSTATE\tDETAIL")
	for _, e := range list {
		state := "open"
		if d := e.Decision; d != nil {
			state = d.Decision + " by " + oneLine(d.DecidedBy, 40)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", e.ExceptionID, e.Kind, orDash(e.PayoutID), intOrDash(e.Seq),
			stamp(e.CreatedAt), state, oneLine(e.Detail, maxDetail))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	what := "open exceptions"
	if opts.All {
		open := 0
		for _, e := range list {
			if e.Open() {
				open++
			}
		}
		what = fmt.Sprintf("exceptions (%d of them open)", open)
	}
	if opts.Kind != "" {
		what += " of kind " + opts.Kind
	}
	switch {
	case more:
		_, err := fmt.Fprintf(w, "\nthe first %d %s; more exist (--limit, --kind). `reconciler exceptions show ID` for one.\n", len(list), what)
		return err
	default:
		_, err := fmt.Fprintf(w, "\n%d %s. `reconciler exceptions show ID` for one.\n", len(list), what)
		return err
	}
}

func writeShow(w io.Writer, c ExceptionContext) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(cells ...string) { fmt.Fprintln(tw, strings.Join(cells, "\t")) }
	section := func(title string) {
		_ = tw.Flush()
		fmt.Fprintf(w, "\n%s\n", title)
	}
	fmt.Fprintf(w, "exception %d: %s\n", c.ExceptionID, c.Kind)
	row("  payout", orDash(c.PayoutID))
	row("  statement seq", intOrDash(c.Seq))
	row("  statement file", intOrDash(c.FileID))
	row("  recorded at", stamp(c.CreatedAt))
	row("  detail", oneLine(c.Detail, 0))
	if d := c.Decision; d != nil {
		row("  decision", d.Decision)
		row("  decided by", d.DecidedBy+" (paydb login "+d.DecidedLogin+")")
		row("  decided at", stamp(d.DecidedAt))
		row("  note", oneLine(d.Note, 0))
	} else {
		row("  decision", "none: open (resolve with `reconciler exceptions resolve "+strconv.FormatInt(c.ExceptionID, 10)+" --decision … --by … --note …`)")
	}

	if c.PayoutID != nil {
		section("payout, as it is now (payout)")
		if p := c.Payout; p != nil {
			row("  ACCOUNT", "AMOUNT", "BENEFICIARY", "STATUS", "FENCE TOKEN", "CLAIMED BY", "RAIL REF", "DECLINE", "UPDATED (UTC)")
			row("  "+p.AccountID, amount(p.AmountMinor, p.Currency), p.Beneficiary, p.Status, strconv.FormatInt(p.FenceToken, 10),
				orDash(p.ClaimedBy), orDash(p.RailReference), orDash(p.DeclineReason), stamp(p.UpdatedAt))
		} else {
			row("  no payout has this id")
		}
		section("its history (payout_history)")
		row("  ID", "STATUS", "TOKEN", "OWNER", "ACTOR", "RAIL REF", "DECLINE", "RECORDED (UTC)")
		for _, m := range c.History {
			row("  "+strconv.FormatInt(m.HistoryID, 10), m.Status, strconv.FormatInt(m.FenceToken, 10), orDash(m.OwnerID),
				orDash(m.Actor), orDash(m.RailReference), orDash(m.DeclineReason), stamp(m.RecordedAt))
		}
		section("its settlement (payout_settlement)")
		if s := c.Settlement; s != nil {
			row("  OUTCOME", "RAIL REF", "DECLINE", "STATEMENT SEQ", "SETTLED (UTC)")
			row("  "+s.Outcome, orDash(s.RailReference), orDash(s.DeclineReason), intOrDash(s.StatementSeq), stamp(s.SettledAt))
		} else {
			row("  none: no settle moved it")
		}
		section("its attempts at the gate (rail_submission)")
		row("  ID", "TOKEN", "OWNER", "SUBMITTER", "ACCOUNT", "AMOUNT", "BENEFICIARY", "OUTCOME", "RAIL REF", "SUBMITTED (UTC)")
		for _, s := range c.Submissions {
			outcome := "unresolved"
			if s.Outcome != nil {
				outcome = *s.Outcome
			}
			row("  "+strconv.FormatInt(s.SubmissionID, 10), strconv.FormatInt(s.PresentedToken, 10), s.OwnerID, orDash(s.SubmitterIdentity),
				s.AccountID, amount(s.AmountMinor, s.Currency), s.Beneficiary, outcome, orDash(s.RailReference), stamp(s.SubmittedAt))
		}
	}
	if c.PayoutID != nil || c.Seq != nil {
		section("statement lines (rail_statement_line: the payout's reference, and the exception's own line)")
		row("  SEQ", "RECEIVED (UTC)", "REFERENCE", "ACCOUNT", "AMOUNT", "BENEFICIARY", "RESULT", "RAIL REF", "DECLINE")
		for _, l := range c.Lines {
			row("  "+strconv.FormatInt(l.Seq, 10), stamp(l.ReceivedAt), l.Reference, l.AccountID, amount(l.AmountMinor, l.Currency),
				orDash(l.Beneficiary), l.Result, orDash(l.RailReference), orDash(l.DeclineReason))
		}
	}
	if c.FileID != nil {
		section("statement file versions (statement_file)")
		row("  ID", "NAME", "SHA-256", "RESULT", "ENTRIES", "AT (UTC)")
		for _, f := range c.Files {
			entries := "-"
			if f.Entries != nil {
				entries = strconv.Itoa(*f.Entries)
			}
			row("  "+strconv.FormatInt(f.FileID, 10), f.Name, f.SHA256, f.Result, entries, stamp(f.ImportedAt))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, "\nDeciding records a conclusion beside the exception; it never settles or unsettles the payout.")
	return err
}

// stamp is a time as the tables show it: UTC, to the second.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func orDash(s *string) string {
	if s == nil || *s == "" {
		return "-"
	}
	return oneLine(*s, 0)
}

func intOrDash(n *int64) string {
	if n == nil {
		return "-"
	}
	return strconv.FormatInt(*n, 10)
}

// amount is minor units and the currency, as paydb holds them: no rounding,
// no guess at the currency's exponent.
func amount(minor int64, currency string) string {
	return strconv.FormatInt(minor, 10) + " " + oneLine(currency, 0)
}

// oneLine keeps a cell on one line of the table, whatever the text: control
// characters (a note's line breaks, a tab that would split the cell) are shown
// as spaces, and text longer than limit characters (0: no bound) is cut with "…".
func oneLine(s string, limit int) string {
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	if r := []rune(s); limit > 0 && len(r) > limit {
		return string(r[:limit-1]) + "…"
	}
	return s
}

package lockapi_test

import (
	"errors"
	"fmt"

	"lock.dev/lockapi"
)

// A fenced call carries the lease's token and owner, and its signed grant when
// lock-server signs them. A team that does not use lockclient builds them so.
func ExampleFencingHeaders() {
	h := lockapi.FencingHeaders(42, "", "worker-7")
	fmt.Println(h.Get(lockapi.HeaderFencingToken), h.Get(lockapi.HeaderOwnerID), len(h.Values(lockapi.HeaderFencingGrant)))
	// Output: 42 worker-7 0
}

// A resource parses a presented token strictly: a token that could be written
// two ways could be compared two ways.
func ExampleParseToken() {
	for _, s := range []string{"42", "042", "+42", "9223372036854775808"} {
		tok, err := lockapi.ParseToken(s)
		fmt.Println(s, tok, errors.Is(err, lockapi.ErrInvalid))
	}
	// Output:
	// 42 42 false
	// 042 0 true
	// +42 0 true
	// 9223372036854775808 0 true
}

// The lock an executor takes before it pays from an account.
func ExampleAccountLockName() {
	fmt.Println(lockapi.AccountLockName("acct-7"))
	// Output: account:acct-7
}

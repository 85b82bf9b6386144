package fence

// CacheLen is how many verified grants v remembers (for tests).
func CacheLen(v *Verifier) int { return v.cur.Load().cache.len() }

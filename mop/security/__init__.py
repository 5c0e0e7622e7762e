"""Authentication, authorization and abuse protection, enforced by the processor for every
protocol adapter: who a client is (`identity`), what it may do (`acl`), how it proves it
(`passwords`, `tokens`, certificates) and who is kept out (`abuse`)."""

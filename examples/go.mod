module github.com/idemkit/idem/examples

go 1.26.0

require github.com/idemkit/idem v0.0.0

replace github.com/idemkit/idem => ../

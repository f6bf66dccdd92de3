// The login form sends the page the viewer asked for (the address's #/...) back with it.
document.getElementById("next").value = location.hash;
